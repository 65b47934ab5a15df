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
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.clock import monotonic_seconds
from engine.errors import Nondeterminism
from engine.explore.result import (
    CODES,
    DUCKDB_SHARE,
    RULES,
    Failing,
    PairResult,
    new_world,
    render_trace,
    replay,
)
from engine.explore.scenario import Scenario
from engine.model import Protocol

__all__ = [
    "CODES",
    "Failing",
    "PairExplorer",
    "PairResult",
    "explore",
    "explore_pair",
    "render_trace",
    "replay",
]

MERGE_DUCKDB_SHARE = 128
"""With ``merge``: one run in this many of a pair's budget is a sampled run on the DuckDB ledger
(besides one in every fourth pair)."""
STRATEGIES = ("merge", "sample", "dfs")
"""``merge``: the merging depth-first search (``engine.explore.prune``; exhaustive where the budget
allows); ``sample``/``dfs``: one full run per interleaving, unexplored branches in seeded random or
index order."""
MAX_STEPS = 250
"""Steps after which a run counts as unsettled (no scenario needs more than a few dozen)."""


@dataclass(slots=True)
class _Node:
    n: int = -1
    kids: dict[int, _Node] = field(default_factory=dict)
    done: int = 0
    complete: bool = False


def pair_seed(seed: int, scenario: str, protocol: Protocol) -> int:
    """A per-pair seed that does not depend on Python's string hashing."""
    return (seed * 1_000_003) ^ zlib.crc32(f"{scenario}/{protocol}".encode())


class PairExplorer:
    """The choice tree of one (scenario, protocol) on the shipped code, explored a budget at a time.

    Calling ``run`` again continues the same tree, so later budgets never repeat a run.
    """

    def __init__(
        self,
        scenario: Scenario,
        protocol: Protocol,
        *,
        seed: int = 0,
        strategy: str = "sample",
        max_steps: int = MAX_STEPS,
        code: str = "shipped",
        ledger: str | None = None,
    ) -> None:
        if code not in CODES:
            raise ValueError(f"unknown code {code!r}; choose one of {', '.join(CODES)}")
        if strategy not in STRATEGIES[1:]:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        self.scenario = scenario
        self.protocol = protocol
        self.dfs = strategy == "dfs"
        self.max_steps = max_steps
        self.rng = random.Random(pair_seed(seed, scenario.name, protocol))
        self.root = _Node()
        self.code = code
        self.result = PairResult(scenario.name, protocol, RULES, seed, code=code)
        self.record: list[tuple[int, ...]] | None = None
        """When a list, every run's choices are appended to it (for tests)."""
        self.ledger = ledger
        """``None``: every ``DUCKDB_SHARE``-th run on the DuckDB ledger, the others in memory."""

    @property
    def exhausted(self) -> bool:
        return self.root.complete

    def run(self, budget: int) -> int:
        """Run up to ``budget`` new interleavings; return how many ran (fewer once exhausted).

        Raises:
            Nondeterminism: a replayed prefix enabled different steps (a bug in the simulation).
        """
        started = monotonic_seconds()
        result = self.result
        ran = 0
        while ran < budget and not self.root.complete:
            self._one(result)
            ran += 1
        result.exhaustive = self.root.complete
        result.seconds += monotonic_seconds() - started
        return ran

    def _one(self, result: PairResult) -> None:
        scenario, protocol, rng, dfs = self.scenario, self.protocol, self.rng, self.dfs
        # A share of the runs write through the real DuckDB ledger.
        share = result.explored % DUCKDB_SHARE == DUCKDB_SHARE - 1
        ledger = self.ledger or ("duckdb" if share else "memory")
        world = new_world(scenario, protocol, trace=False, ledger=ledger)
        node = self.root
        path: list[_Node] = []
        choices: list[int] = []
        max_steps = self.max_steps
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
            path.append(node)
            node = child
        unsettled = not world.aborted and world.steps >= max_steps
        node.complete = True
        for parent in reversed(path):
            parent.done += 1
            if parent.done < parent.n:
                break
            parent.complete = True
        result.explored += 1
        result.runs += 1
        if self.record is not None:
            self.record.append(tuple(choices))
        findings = world.finish(unsettled=unsettled)
        if findings:
            result.divergent += 1
            for kind, _ in findings:
                result.kinds[kind] = result.kinds.get(kind, 0) + 1
            if result.shortest is None or len(choices) < len(result.shortest.choices):
                result.shortest = Failing(tuple(choices), tuple(findings), ledger)
        elif world.parked:
            result.parked += 1
        else:
            result.receipts += 1

    def finish(self) -> PairResult:
        """The result so far, with the shortest divergent run rendered as a trace."""
        result = self.result
        if result.shortest is not None and result.trace is None:
            shortest = result.shortest
            result.trace = render_trace(
                self.scenario, self.protocol, shortest.choices, shortest.findings, ledger=shortest.ledger
            )
        return result


def explore_pair(
    scenario: Scenario,
    protocol: Protocol,
    *,
    budget: int,
    seed: int = 0,
    strategy: str = "sample",
    max_steps: int = MAX_STEPS,
    code: str = "shipped",
) -> PairResult:
    """Run up to ``budget`` distinct interleavings of ``scenario`` under ``protocol``.

    Raises:
        Nondeterminism: a replayed prefix enabled different steps (a bug in the simulation).
    """
    explorer = PairExplorer(scenario, protocol, seed=seed, strategy=strategy, max_steps=max_steps, code=code)
    explorer.run(budget)
    return explorer.finish()


def explore(
    pairs: Iterable[tuple[Scenario, Protocol]],
    *,
    permutations: int,
    seed: int = 0,
    strategy: str = "merge",
    max_steps: int = MAX_STEPS,
    code: str = "shipped",
) -> list[PairResult]:
    """Share a budget of ``permutations`` runs across the pairs.

    ``merge`` (the default): each pair in turn gets an equal share of what is left for its merging
    search (``engine.explore.prune``), of which a few (one in every fourth pair, plus one in
    ``MERGE_DUCKDB_SHARE``) are sampled runs on the real DuckDB ledger; what a pair leaves over goes to the pairs after it.
    ``explored`` is then the interleavings covered, ``runs`` the runs it took. ``sample``/``dfs``:
    each pair first gets an equal share of runs; what small (exhausted) trees leave over is shared
    again among the pairs that still have unexplored interleavings.
    """
    pairs = list(pairs)
    if strategy == "merge":
        return _explore_merged(pairs, permutations, seed, max_steps, code)
    explorers = [
        PairExplorer(s, p, seed=seed, strategy=strategy, max_steps=max_steps, code=code) for s, p in pairs
    ]
    remaining = permutations
    while remaining > 0:
        open_ = [e for e in explorers if not e.exhausted]
        if not open_:
            break
        ran = 0
        for index, explorer in enumerate(open_):
            share = max(1, (remaining - ran) // (len(open_) - index))
            ran += explorer.run(min(share, remaining - ran))
            if ran >= remaining:
                break
        remaining -= ran
        if ran == 0:
            break
    return [e.finish() for e in explorers]


def _explore_merged(
    pairs: list[tuple[Scenario, Protocol]], permutations: int, seed: int, max_steps: int, code: str
) -> list[PairResult]:
    from engine.explore.prune import explore_merged  # imported here: prune imports this module's kin

    if code not in CODES:
        raise ValueError(f"unknown code {code!r}; choose one of {', '.join(CODES)}")
    results = []
    duck: list[tuple[PairResult, PairExplorer, int]] = []
    remaining = permutations
    for index, (scenario, protocol) in enumerate(pairs):
        share = max(2, remaining // (len(pairs) - index))
        # The real DuckDB ledger costs some 300 ms a run (every write a SQL transaction), about
        # fifteen in-memory runs: a sampled share of it, one run in every fourth pair plus one in
        # MERGE_DUCKDB_SHARE of each pair's budget. They run after every pair's merging search:
        # DuckDB starts worker threads, and a process with threads is not forked (``prune``).
        on_duckdb = min(share - 1, (1 if index % 4 == 0 else 0) + share // MERGE_DUCKDB_SHARE)
        result = explore_merged(scenario, protocol, max_runs=share - on_duckdb, max_steps=max_steps)
        result.seed = seed
        sampler = PairExplorer(scenario, protocol, seed=seed, max_steps=max_steps, ledger="duckdb")
        duck.append((result, sampler, on_duckdb))
        remaining = max(0, remaining - result.runs - on_duckdb)
        results.append(result)
    for result, sampler, on_duckdb in duck:
        if on_duckdb:
            sampler.run(on_duckdb)
        sampled = sampler.result
        result.runs += sampled.runs
        result.seconds += sampled.seconds
        result.divergent += sampled.divergent
        for kind, n in sampled.kinds.items():
            result.kinds[kind] = result.kinds.get(kind, 0) + n
        if sampled.shortest is not None and (
            result.shortest is None or len(sampled.shortest.choices) < len(result.shortest.choices)
        ):
            result.shortest = sampled.shortest
        if result.shortest is not None:
            shortest = result.shortest
            result.trace = render_trace(
                sampler.scenario,
                sampler.protocol,
                shortest.choices,
                shortest.findings,
                ledger=shortest.ledger,
            )
    return results


def selected_pairs(scenarios: Iterable[Scenario]) -> list[tuple[Scenario, Protocol]]:
    """Every (scenario, protocol) pair the scenarios list."""
    return [(s, p) for s in scenarios for p in s.protocols]
