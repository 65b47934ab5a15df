"""The explorer: walk each scenario's tree of interleavings, judge every run, keep the shortest failure.

A run is the sequence of choices "which enabled step runs next". The explorer keeps a trie of the
choices made so far and marks a subtree complete once every branch under it was run, so no
interleaving is ever run twice: when a scenario's whole tree fits the budget it is enumerated
exhaustively (``exhaustive`` is then true), otherwise the unexplored branches are taken in seeded
random order (``strategy="sample"``) or in index order (``strategy="dfs"``). The shortest divergent
run is replayed with a trace. Deterministic for a given seed; no I/O.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from engine.clock import monotonic_seconds
from engine.explore.rules import ENGINE, Rules
from engine.explore.scenario import Scenario
from engine.explore.world import Finding, World
from engine.model import Protocol

MAX_STEPS = 250
"""Steps after which a run counts as unsettled (no scenario needs more than a few dozen)."""


class Nondeterminism(RuntimeError):
    """The same choices led to a different set of enabled steps: the simulation is not deterministic."""


@dataclass(slots=True)
class _Node:
    n: int = -1
    kids: dict[int, _Node] = field(default_factory=dict)
    done: int = 0
    complete: bool = False


@dataclass(frozen=True, slots=True)
class Failing:
    """One divergent run: its choices (replayable) and what was wrong with it."""

    choices: tuple[int, ...]
    findings: tuple[Finding, ...]


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
    shortest: Failing | None = None
    trace: str | None = None
    seconds: float = 0.0


def pair_seed(seed: int, scenario: str, protocol: Protocol) -> int:
    """A per-pair seed that does not depend on Python's string hashing."""
    return (seed * 1_000_003) ^ zlib.crc32(f"{scenario}/{protocol}".encode())


def explore_pair(
    scenario: Scenario,
    protocol: Protocol,
    *,
    rules: Rules = ENGINE,
    budget: int,
    seed: int = 0,
    strategy: str = "sample",
    max_steps: int = MAX_STEPS,
) -> PairResult:
    """Run up to ``budget`` distinct interleavings of ``scenario`` under ``protocol``.

    Raises:
        Nondeterminism: a replayed prefix enabled different steps (a bug in the simulation).
    """
    started = monotonic_seconds()
    rng = random.Random(pair_seed(seed, scenario.name, protocol))
    result = PairResult(scenario.name, protocol, rules.name, seed)
    root = _Node()
    dfs = strategy == "dfs"
    while result.explored < budget and not root.complete:
        world = World(scenario, protocol, rules)
        node = root
        path: list[tuple[_Node, _Node]] = []
        choices: list[int] = []
        while not world.aborted and world.steps < max_steps:
            enabled = world.enabled()
            n = len(enabled)
            if node.n < 0:
                node.n = n
            elif node.n != n:
                raise Nondeterminism(f"{scenario.name}/{protocol}: {choices} enabled {n}, before {node.n}")
            if n == 0:
                break
            kids = node.kids
            if n == 1:
                i = 0
            else:
                open_ = [j for j in range(n) if (k := kids.get(j)) is None or not k.complete]
                i = open_[0] if dfs else open_[rng.randrange(len(open_))]
            child = kids.get(i)
            if child is None:
                child = kids[i] = _Node()
            world.perform(enabled[i])
            choices.append(i)
            path.append((node, child))
            node = child
        unsettled = not world.aborted and world.steps >= max_steps
        node.complete = True
        for parent, _ in reversed(path):
            parent.done += 1
            if parent.done < parent.n:
                break
            parent.complete = True
        result.explored += 1
        findings = world.finish(unsettled=unsettled)
        if findings:
            result.divergent += 1
            for kind, _ in findings:
                result.kinds[kind] = result.kinds.get(kind, 0) + 1
            if result.shortest is None or len(choices) < len(result.shortest.choices):
                result.shortest = Failing(tuple(choices), tuple(findings))
        elif world.parked:
            result.parked += 1
        else:
            result.receipts += 1
    result.exhaustive = root.complete
    if result.shortest is not None:
        result.trace = render_trace(scenario, protocol, rules, result.shortest.choices)
    result.seconds = monotonic_seconds() - started
    return result


def replay(scenario: Scenario, protocol: Protocol, rules: Rules, choices: Sequence[int]) -> World:
    """Run one interleaving again, by its choices, with a trace."""
    world = World(scenario, protocol, rules, trace=True)
    for i in choices:
        world.perform(world.enabled()[i])
    return world


def render_trace(scenario: Scenario, protocol: Protocol, rules: Rules, choices: Sequence[int]) -> str:
    """The interleaving as readable lines: step, actor, action -> local state / server state."""
    world = replay(scenario, protocol, rules, choices)
    findings = world.finish()
    head = (
        f"{scenario.name} on {protocol} (rules: {rules.name}), {len(choices)} steps, choices {list(choices)}"
    )
    body = world.lines or []
    tail = [f"  DIVERGENCE {kind}: {detail}" for kind, detail in findings]
    return "\n".join([head, *body, *tail])


def explore(
    pairs: Iterable[tuple[Scenario, Protocol]],
    *,
    permutations: int,
    rules: Rules = ENGINE,
    seed: int = 0,
    strategy: str = "sample",
    max_steps: int = MAX_STEPS,
) -> list[PairResult]:
    """Share ``permutations`` interleavings across the pairs; what a small tree leaves over goes on."""
    todo = list(pairs)
    results: list[PairResult] = []
    remaining = permutations
    for index, (scenario, protocol) in enumerate(todo):
        share = max(1, remaining // (len(todo) - index))
        result = explore_pair(
            scenario, protocol, rules=rules, budget=share, seed=seed, strategy=strategy, max_steps=max_steps
        )
        results.append(result)
        remaining = max(0, remaining - result.explored)
    return results


def selected_pairs(scenarios: Iterable[Scenario]) -> list[tuple[Scenario, Protocol]]:
    """Every (scenario, protocol) pair the scenarios list."""
    return [(s, p) for s in scenarios for p in s.protocols]
