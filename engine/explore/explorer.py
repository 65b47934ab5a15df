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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.clock import monotonic_seconds
from engine.errors import Nondeterminism
from engine.explore.result import (
    CODES,
    DUCKDB_SHARE,
    RULES,
    SPACE_ESTIMATE,
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
    "explore_exhaustive",
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

    ``merge`` (the default): a first pass gives each pair an equal share of half the budget for its
    merging search (``engine.explore.prune``), of which a few (one in every fourth pair, plus one
    in ``MERGE_DUCKDB_SHARE``) are sampled runs on the real DuckDB ledger; the rest is poured into
    the pairs still open by doubling levels (``_explore_merged``).
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


FIRST_PASS = 0.5
"""The share of a merged budget run's runs spent in its first pass, equally across the pairs; the
rest is poured into the pairs still open, level by level (``_explore_merged``)."""


def _explore_merged(
    pairs: list[tuple[Scenario, Protocol]], permutations: int, seed: int, max_steps: int, code: str
) -> list[PairResult]:
    """First, each pair in turn gets an equal share of ``FIRST_PASS`` of the budget (what one leaves
    over goes to those after it); small trees are exhausted there. Then the rest is poured in by
    levels: the level doubles, and every pair still open (smallest projected need first, ``_need``,
    from its first-pass estimate) resumes its search (``MergingSearch.run`` again: its memo is kept,
    so what it finished costs one short run per branch on the way back, a few runs a resume) until
    it has taken the level's runs in all, while the budget lasts. So every pair that needs fewer
    runs than the last level reached is exhausted, whatever its place in the catalogue, and a large
    pair takes no more than the level (before: each pair in catalogue order got an equal share of
    what was left, and a pair just over its share stayed sampled while later ones had room)."""
    from engine.explore.prune import PROBES, MergingSearch, estimate_paths, search_result

    if code not in CODES:
        raise ValueError(f"unknown code {code!r}; choose one of {', '.join(CODES)}")
    results: list[PairResult] = []
    searches: list[MergingSearch] = []
    duck: list[tuple[Scenario, int]] = []
    remaining = permutations
    first = int(permutations * FIRST_PASS)
    level = max(2, first // max(1, len(pairs)))
    for index, (scenario, protocol) in enumerate(pairs):
        share = max(2, first // (len(pairs) - index))
        on_duckdb = min(share - 1, _duckdb_runs(index, share))
        search = MergingSearch(scenario, protocol, max_runs=share - on_duckdb, max_steps=max_steps)
        result = search_result(search)
        duck.append((scenario, on_duckdb))
        spent = result.runs + on_duckdb
        first = max(0, first - spent)
        remaining = max(0, remaining - spent)
        results.append(result)
        searches.append(search)
    order = sorted(range(len(results)), key=lambda i: _need(results[i]))
    resumed: set[int] = set()
    while remaining > 0:
        open_ = [i for i in order if not results[i].exhaustive]
        if not open_:
            break
        level *= 2
        for i in open_:
            grant = min(remaining, level - searches[i].runs)
            if grant <= 0:
                continue
            search, before = searches[i], results[i]
            ran = search.runs
            search.max_runs = ran + grant
            results[i] = search_result(search, probes=0)
            results[i].seconds += before.seconds
            resumed.add(i)
            remaining -= search.runs - ran
            if remaining <= 0:
                break
    for i in resumed:
        r = results[i]
        if not r.exhaustive:  # the estimate of a pair that stays sampled, from what it finished
            r.space = max(float(r.explored), estimate_paths(searches[i], PROBES))
            r.space_probes = PROBES
            r.space_kind = SPACE_ESTIMATE
    for result, (scenario, on_duckdb) in zip(results, duck, strict=True):
        result.seed = seed
        _add_duckdb_share(result, scenario, on_duckdb, seed, max_steps)
    return results


def _need(result: PairResult) -> float:
    """The runs a sampled pair is projected to need to finish: the runs it took per interleaving it
    covered, times the interleavings its estimate says are left (estimates run low more often than
    high, so this only orders the pairs within a level)."""
    space = result.space if result.space is not None else float(result.explored)
    per = result.runs / max(1, result.explored)
    return per * max(0.0, space - result.explored)


def _duckdb_runs(index: int, runs: int) -> int:
    """The sampled DuckDB runs of the ``index``-th pair whose merging search has ``runs`` runs.

    The real DuckDB ledger costs some 300 ms a run (every write a SQL transaction), about fifteen
    in-memory runs: a sampled share of it, one run in every fourth pair plus one in
    ``MERGE_DUCKDB_SHARE`` of each pair's budget. They run after every pair's merging search:
    DuckDB starts worker threads, and a process with threads is not forked (``prune``).
    """
    return (1 if index % 4 == 0 else 0) + runs // MERGE_DUCKDB_SHARE


def _add_duckdb_share(result: PairResult, scenario: Scenario, runs: int, seed: int, max_steps: int) -> None:
    """Run ``runs`` sampled interleavings of ``result``'s pair on the DuckDB ledger and add what they
    found (runs, divergences; no interleavings: they repeat ones covered in memory); render the
    shortest divergent run as a trace."""
    sampler = PairExplorer(scenario, result.protocol, seed=seed, max_steps=max_steps, ledger="duckdb")
    if runs:
        sampler.run(runs)
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
            scenario, result.protocol, shortest.choices, shortest.findings, ledger=shortest.ledger
        )


SPACE_LIMIT = 1_000_000
"""Issue 15: every pair with fewer interleavings than this is explored exhaustively."""
PAIR_RUNS = 2_000_000
"""``explore_exhaustive``'s default cap on one pair's runs (a pair that reaches it is ``capped``)."""


def explore_exhaustive(
    pairs: Iterable[tuple[Scenario, Protocol]],
    *,
    limit: int = SPACE_LIMIT,
    pair_runs: int = PAIR_RUNS,
    pair_seconds: float | None = None,
    seed: int = 0,
    max_steps: int = MAX_STEPS,
    progress: Callable[[PairResult], None] | None = None,
    clock: Callable[[], float] = monotonic_seconds,
) -> list[PairResult]:
    """Search every pair until its tree is exhausted or ``limit`` interleavings are covered.

    Each pair ends one of three ways (``ending``): ``exhausted`` (``space`` exact, every
    interleaving covered), ``at-limit`` (at least ``limit`` distinct interleavings covered and
    judged without exhausting: ``space`` is that count, a proven lower bound, so the pair is not
    one of those the rule "exhaustive under ``limit``" is about), or ``capped``: it hit
    ``pair_runs`` or ``pair_seconds`` first and is neither (``space`` an estimate). No budget is
    shared: every pair gets its own caps. The DuckDB share is sampled as in ``explore``.
    ``progress`` is called with each pair's result as it ends (its DuckDB share still to come).
    """
    from engine.explore.prune import MergingSearch, search_result

    results = []
    searched: list[tuple[PairResult, Scenario, int]] = []
    for index, (scenario, protocol) in enumerate(pairs):
        deadline = None if pair_seconds is None else clock() + pair_seconds
        search = MergingSearch(
            scenario,
            protocol,
            max_runs=pair_runs,
            max_steps=max_steps,
            max_paths=limit,
            deadline=deadline,
            clock=clock,
        )
        result = search_result(search)
        result.seed = seed
        if progress is not None:
            progress(result)
        searched.append((result, scenario, _duckdb_runs(index, result.runs)))
        results.append(result)
    for result, scenario, on_duckdb in searched:
        _add_duckdb_share(result, scenario, on_duckdb, seed, max_steps)
    return results


def selected_pairs(scenarios: Iterable[Scenario]) -> list[tuple[Scenario, Protocol]]:
    """Every (scenario, protocol) pair the scenarios list."""
    return [(s, p) for s in scenarios for p in s.protocols]
