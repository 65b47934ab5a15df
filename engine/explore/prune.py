"""Exhaustive exploration of the shipped code with equivalent interleavings merged.

A depth-first walk over the choice tree of one (scenario, protocol) pair in which a state seen
before is not explored again: at every state (``WireWorld.state_key``; in the middle of an exchange
the live coroutines by the label of the step they last ran in) the run's state is keyed, and two
interleavings that reach equal keys have the same futures, so the subtree below is run once and its summary (how many
interleavings lie below, how many diverge and how, how many end parked or with a receipt, the
shortest divergent continuation) is reused for every other way of reaching it. The counts are exact
counts of distinct interleavings, though only distinct states are executed; the tests check them
against running every interleaving one by one.

The shipped code's state cannot be copied (it lives in coroutines), so the walk continues the run
it has in hand into the last branch and reaches each other branch from a copy of the whole process:
``os.fork`` at the branching point, the child takes its branch and the parent waits for it (one
core: never two at once), then reads back the child's summary, the states it keyed and its runs.
Where a process cannot be forked safely (no ``fork``, or a second thread in the process: the DuckDB
ledger's worker threads would be lost, and a lock one of them held would never be released in the
child) every other branch is reached by running its prefix again from the start, as before. Either
way the same code runs the same steps: a forked child is the same run continued, not a model of it
(``runs`` counts every run started, from the start or from a fork). A state that repeats on its own path is a cycle:
that interleaving never settles and counts as divergent. When the run budget ends first, the
result counts the interleavings below the subtrees completed so far (all distinct, all judged) and
says ``exhaustive=False``. Deterministic; no I/O.
"""

from __future__ import annotations

import gc
import os
import pickle
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.clock import monotonic_seconds
from engine.errors import EngineError, Nondeterminism
from engine.explore.keys import Digest, digest
from engine.explore.result import (
    RULES,
    SPACE_AT_LEAST,
    SPACE_ESTIMATE,
    SPACE_EXACT,
    Failing,
    Finding,
    PairResult,
    new_world,
)
from engine.explore.scenario import Scenario
from engine.model import Protocol

MAX_STEPS = 250
"""Steps after which a run counts as unsettled (as in the sampling walk)."""
UNSETTLED = "unsettled"
MAX_FORK_DEPTH = 96
"""Forked processes waiting on one another at most (each keeps the pages its run touched); deeper
branches are reached by replaying their prefix."""
FORK_AFTER = 12
"""Branches after this many steps are reached by forking, shorter ones by replaying their prefix:
a fork costs about as much as replaying a dozen steps (it copies the process's page tables, and
the child its pages as it writes them)."""
Fingerprint = Digest
_UNKNOWN = object()


fingerprint = digest
"""The memo's key of a state key (``engine.explore.keys.digest``)."""


def can_fork() -> bool:
    """Whether this process may fork a copy of itself for a branch: POSIX ``fork`` and no second
    thread (on Linux counted from ``/proc``, which also sees threads no Python code started)."""
    if not hasattr(os, "fork"):
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


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


def _futures(summary: Summary) -> tuple[object, ...]:
    """What a subtree's summary says of its futures, whatever the order its choices came in."""
    return (summary.paths, summary.divergent, summary.parked, summary.receipts, sorted(summary.kinds.items()))


def _leaf(findings: list[Finding], parked: bool) -> Summary:
    if findings:
        kinds = {kind: 1 for kind, _ in findings}
        return Summary(1, 1, 0, 0, kinds, (), tuple(findings))
    if parked:
        return Summary(1, 0, 1, 0)
    return Summary(1, 0, 0, 1)


STOP_RUNS = "runs"
"""The search stopped at its run budget (``max_runs``)."""
STOP_PATHS = "paths"
"""The search stopped having covered ``max_paths`` interleavings: the pair has at least that many."""
STOP_TIME = "time"
"""The search stopped at its deadline."""


class OutOfRuns(EngineError):
    """The run budget ended; ``partial`` sums the subtrees completed so far (none of them twice);
    ``reason`` says which budget (``STOP_RUNS``, ``STOP_PATHS``, ``STOP_TIME``)."""

    def __init__(self, reason: str = STOP_RUNS) -> None:
        super().__init__(f"run budget spent ({reason})")
        self.partial = Summary()
        self.reason = reason

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
        self,
        scenario: Scenario,
        protocol: Protocol,
        *,
        max_runs: int,
        max_steps: int = MAX_STEPS,
        fork: bool | None = None,
        fork_after: int = FORK_AFTER,
        check: Callable[[Any], Digest | None] | None = None,
        max_paths: int | None = None,
        deadline: float | None = None,
        clock: Callable[[], float] = monotonic_seconds,
    ) -> None:
        """``fork``: reach branches by forking (``None``: where ``can_fork`` says it is safe), those
        after ``fork_after`` steps. ``check``: merge nothing, key every state by ``check(world)``
        and list in ``unsound`` every state whose key an earlier state had with other futures (the
        state key's own test: a sound key lists none; no forking). ``max_paths``: start no new run
        once the finished subtrees cover this many interleavings (the pair is then proven to have
        at least that many). ``deadline``: start no new run once ``clock()`` has passed it."""
        self.scenario = scenario
        self.protocol = protocol
        self.max_runs = max_runs
        self.max_paths = max_paths
        self.deadline = deadline
        self.clock = clock
        self.max_steps = max_steps
        self.memo: dict[Fingerprint, Summary] = {}
        self.on_path: set[Fingerprint] = set()
        self.runs = 0
        self.covered = 0
        """Interleavings below the subtrees finished so far in this ``run`` (each leaf, cycle and
        memo hit adds its count as it returns: together they tile every finished subtree)."""
        self.stopped: str | None = None
        """Why the last ``run`` ended early: ``STOP_RUNS``, ``STOP_PATHS``, ``STOP_TIME``; ``None``: it
        covered every interleaving."""
        self.merged = 0
        """Times a state was found in the memo (a subtree not run again)."""
        self.forks = 0
        """Runs started from a fork (the others from the start)."""
        self.fork = False if check is not None else fork
        self.fork_after = fork_after
        self.check = check
        self.unsound: list[tuple[tuple[int, ...], Summary, Summary]] = []
        """``check`` only: (choices to a state, its futures, the futures of an earlier state with its key)."""
        self._depth = 0
        """Forked ancestors of this process waiting on it."""
        self._digests: dict[tuple[int, ...], Fingerprint | None] = {}
        """The key of the state after each prefix visited (a replayed prefix's steps are labelled
        from them, not by keying every state again)."""
        self._added: list[tuple[Fingerprint, Summary]] = []
        """Memo entries made in this process since it was forked (sent back to its parent)."""

    def _spent(self) -> str | None:
        """Why no new run may start (``None``: one may)."""
        if self.runs >= self.max_runs:
            return STOP_RUNS
        if self.max_paths is not None and self.covered >= self.max_paths:
            return STOP_PATHS
        if self.deadline is not None and self.clock() >= self.deadline:
            return STOP_TIME
        return None

    def _start(self, prefix: list[int]) -> object:
        if (why := self._spent()) is not None:
            raise OutOfRuns(why)
        self.runs += 1
        world: Any = new_world(self.scenario, self.protocol, trace=False)
        digests = self._digests
        for j, i in enumerate(prefix):
            enabled = world.enabled()
            if i >= len(enabled):
                world.close()
                raise Nondeterminism(f"{self.scenario.name}/{self.protocol}: {prefix} no longer replays")
            # The run is the same run again: the state before each step has the key it had when
            # visited (the step's label reads it), so it is not computed again.
            known = digests.get(tuple(prefix[:j]), _UNKNOWN)
            if known is not _UNKNOWN:
                world.prime_digest(known)
            world.perform(enabled[i])
        return world

    def visit(self, world: object, prefix: list[int]) -> Summary:
        """The summary of every interleaving below the state ``world`` is in (after ``prefix``)."""
        from engine.explore.shipped import WireWorld

        assert isinstance(world, WireWorld)
        # The choices first: ``enabled`` moves the server's task on to the virtual now, and the key
        # (and the label of the step taken next, ``keys.Tracked``) is of the state the step is
        # taken in, whether the run got there by a fork or by replaying its prefix.
        enabled = [] if world.aborted else world.enabled()
        key = world.state_digest() if self.check is None else self.check(world)
        if self.check is None:
            self._digests[tuple(prefix)] = key
        if key is not None:
            hit = self.memo.get(key)
            if hit is not None and self.check is None:
                self.merged += 1
                self.covered += hit.paths
                world.close()
                return hit
            if key in self.on_path:
                world.close()
                finding = (UNSETTLED, "the run returns to a state it was in: it can cycle for ever")
                self.covered += 1
                return Summary(1, 1, 0, 0, {UNSETTLED: 1}, (), (finding,))
        if not enabled or world.steps >= self.max_steps:
            parked = world.parked
            summary = _leaf(world.finish(unsettled=bool(enabled)), parked)
            self.covered += 1
        else:
            n = len(enabled)
            summary = Summary()
            if key is not None:
                self.on_path.add(key)
            forking = self._forking(prefix)
            try:
                for i in range(n):
                    if forking and i < n - 1:
                        prefix.append(i)
                        try:
                            summary.add(i, self._forked(world, enabled[i], prefix))
                        finally:
                            prefix.pop()
                        continue
                    child = world if i == (n - 1 if forking else 0) else self._start(prefix)
                    if child is not world:
                        again = child.enabled()  # type: ignore[attr-defined]
                        if len(again) != n:
                            raise Nondeterminism(
                                f"{self.scenario.name}/{self.protocol}: {prefix} enabled {len(again)}, before {n}"
                            )
                        child.perform(again[i])  # type: ignore[attr-defined]
                    else:
                        world.perform(enabled[i])
                    prefix.append(i)
                    try:
                        summary.add(i, self.visit(child, prefix))
                    finally:
                        prefix.pop()
            except OutOfRuns as out:
                out.take(prefix, summary)
                world.close()  # the run in hand, if no branch took it (closing twice does nothing)
                raise
            finally:
                if key is not None:
                    self.on_path.discard(key)
        if key is not None:
            earlier = self.memo.get(key)
            if earlier is None:
                self.memo[key] = summary
                self._added.append((key, summary))
            elif _futures(earlier) != _futures(summary):
                self.unsound.append((tuple(prefix), summary, earlier))
        return summary

    def _forking(self, prefix: list[int]) -> bool:
        if len(prefix) < self.fork_after or self._depth >= MAX_FORK_DEPTH:
            return False
        if self.fork is None:
            self.fork = can_fork()
        return self.fork

    def _forked(self, world: object, action: object, prefix: list[int]) -> Summary:
        """The summary below ``action`` taken in ``world`` (after ``prefix``), from a forked copy of
        this process; the child's keyed states and runs are taken over when it ends."""
        if (why := self._spent()) is not None:
            raise OutOfRuns(why)
        from engine.explore import checks

        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        gc.freeze()  # the child's collections then leave the shared pages alone (fewer copies)
        try:
            pid = os.fork()
        except OSError:
            gc.unfreeze()
            os.close(read_end)
            os.close(write_end)
            self.fork = False
            raise
        if pid == 0:  # the child: take the branch, send back what it found, leave without cleanup
            os.close(read_end)
            code = 0
            try:
                self._depth += 1
                self._added = []
                judged = set(checks._JUDGED)
                self.runs += 1
                self.forks += 1
                outcome: tuple[object, ...]
                try:
                    world.perform(action)  # type: ignore[attr-defined]
                    outcome = ("done", self.visit(world, prefix))
                except OutOfRuns as out:
                    outcome = ("out", (out.partial, out.reason))
                except BaseException as exc:
                    outcome = ("error", _portable(exc))
                new = {k: v for k, v in checks._JUDGED.items() if k not in judged}
                data = pickle.dumps(
                    (outcome, self._added, self.runs, self.forks, self.merged, self.covered, new),
                    protocol=pickle.HIGHEST_PROTOCOL,
                )
                view = memoryview(data)
                while view:
                    view = view[os.write(write_end, view) :]
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write_end)
        chunks = []
        try:
            while chunk := os.read(read_end, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(read_end)
            os.waitpid(pid, 0)
            gc.unfreeze()
        if not chunks:
            raise Nondeterminism(f"{self.scenario.name}/{self.protocol}: the forked run at {prefix} died")
        outcome, added, self.runs, self.forks, self.merged, self.covered, judged = pickle.loads(
            b"".join(chunks)
        )
        for key, summary in added:
            self.memo[key] = summary
        self._added.extend(added)
        checks._JUDGED.update(judged)
        kind, value = outcome
        if kind == "out":
            assert isinstance(value, tuple)
            spent = OutOfRuns(value[1])
            spent.partial = value[0]
            raise spent
        if kind == "error":
            assert isinstance(value, BaseException)
            raise value
        assert isinstance(value, Summary)
        return value

    def run(self) -> tuple[Summary, bool]:
        """(the summary, whether it covers every interleaving).

        May be called again after raising ``max_runs`` (or ``max_paths``, ``deadline``): the walk
        starts over from the root with the memo it has, so every subtree it finished is a memo hit
        (one short run each, for the finished branches on the way back to where it stopped) and
        the counts are those of one uninterrupted walk.
        """
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20 * self.max_steps + 1000))
        self.covered = 0
        self.stopped = None
        try:
            return self.visit(self._start([]), []), True
        except OutOfRuns as out:
            self.stopped = out.reason
            return out.partial, False
        finally:
            sys.setrecursionlimit(limit)


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a ``RuntimeError`` saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__} in a forked run: {exc}")
    return exc


PROBES = 4
"""Random probes per sampled pair for the estimate of its size (``estimate_paths``): each costs
about a run (16 doubled the CPU of a 1,000-run exploration, where nearly every pair is sampled)."""


def estimate_paths(search: MergingSearch, probes: int, seed: int = 0) -> float:
    """An estimate of the interleavings of ``search``'s pair: Knuth's random-probe estimator (1975)
    over the merged tree, the mean of ``probes`` probes.

    A probe runs from the start, choosing every step at random, and multiplies the numbers of
    choices it met; where it reaches a state whose subtree the search finished (in its memo), it
    multiplies by that subtree's exact count of interleavings and stops. Each probe's product is
    an unbiased estimate of the number of interleavings; their spread is wide (the trees are
    lopsided), so it is an estimate, good for "over or under a million", not a count.
    """
    rng = random.Random(seed)
    total = 0.0
    for _ in range(probes):
        world: Any = new_world(search.scenario, search.protocol, trace=False)
        product = 1.0
        seen: set[Fingerprint] = set()
        try:
            while True:
                enabled = [] if world.aborted else world.enabled()
                key = world.state_digest()
                if key is not None:
                    hit = search.memo.get(key)
                    if hit is not None:
                        product *= hit.paths
                        break
                    if key in seen:
                        break  # a cycle: one divergent interleaving in the search's count
                    seen.add(key)
                if not enabled or world.steps >= search.max_steps:
                    break
                product *= len(enabled)
                world.perform(enabled[rng.randrange(len(enabled))])
        finally:
            world.close()
        total += product
    return total / probes if probes else 0.0


def explore_merged(
    scenario: Scenario,
    protocol: Protocol,
    *,
    max_runs: int,
    max_steps: int = MAX_STEPS,
    fork: bool | None = None,
    probes: int = PROBES,
    max_paths: int | None = None,
    deadline: float | None = None,
) -> PairResult:
    """Every interleaving of ``scenario`` under ``protocol`` (each distinct state run once), within
    ``max_runs`` runs (and, when given, until ``max_paths`` interleavings are covered or the
    ``deadline`` passes); ``explored`` is the interleavings covered, ``runs`` the runs it took,
    ``states`` the distinct states keyed, ``space`` the pair's interleavings: the exact count when
    exhaustive, at least ``explored`` when it stopped at ``max_paths``, else ``estimate_paths``
    with ``probes`` probes (``space_probes``; runs of their own, not counted in ``runs``).
    """
    search = MergingSearch(
        scenario,
        protocol,
        max_runs=max_runs,
        max_steps=max_steps,
        fork=fork,
        max_paths=max_paths,
        deadline=deadline,
    )
    return search_result(search, probes=probes)


def search_result(search: MergingSearch, *, probes: int = PROBES) -> PairResult:
    """Run ``search`` (again, if it ran before: it goes on where it stopped) and say what it found."""
    started = monotonic_seconds()
    summary, complete = search.run()
    result = PairResult(search.scenario.name, search.protocol, RULES, 0)
    result.explored = summary.paths
    result.runs = search.runs
    result.states = len(search.memo)
    result.exhaustive = complete
    result.stopped = search.stopped
    if complete:
        result.space = float(summary.paths)
        result.space_kind = SPACE_EXACT
    elif search.stopped == STOP_PATHS:
        result.space = float(summary.paths)
        result.space_kind = SPACE_AT_LEAST
    elif probes:
        result.space = max(float(summary.paths), estimate_paths(search, probes))
        result.space_probes = probes
        result.space_kind = SPACE_ESTIMATE
    result.divergent = summary.divergent
    result.parked = summary.parked
    result.receipts = summary.receipts
    result.kinds = dict(summary.kinds)
    if summary.shortest is not None:
        result.shortest = Failing(summary.shortest, summary.findings)
    result.seconds = monotonic_seconds() - started
    return result


__all__ = [
    "MAX_STEPS",
    "PROBES",
    "STOP_PATHS",
    "STOP_RUNS",
    "STOP_TIME",
    "MergingSearch",
    "OutOfRuns",
    "Summary",
    "can_fork",
    "estimate_paths",
    "explore_merged",
    "fingerprint",
    "search_result",
]
