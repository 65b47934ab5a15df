"""``finality explore``: run the race explorer, print what it found, exit 1 on any divergence.

Usage: ``finality explore [--permutations N] [--scenario NAME|all] [--seed S] [--json] [--ledger PATH]
[--strategy merge|sample|dfs] [--replay SCENARIO@PROTOCOL:CHOICES[:duckdb]] [--list]``, or
``finality explore --exhaustive [--space-limit N] [--pair-runs N] [--pair-seconds S] ...``.
Exit codes: 0 no divergence,
1 at least one divergent interleaving (the shortest is printed as a trace), 2 usage error,
3 (``--exhaustive``) no divergence, but a pair hit its run or time cap before either exhausting
its tree or covering ``--space-limit`` interleavings.
Presentation only: the rules live in ``engine.machine`` and the explorer in ``engine.explore``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TextIO

from engine.clock import SystemClock, monotonic_seconds
from engine.errors import EngineError
from engine.explore.explorer import (
    MAX_STEPS,
    PAIR_RUNS,
    SPACE_LIMIT,
    STRATEGIES,
    PairResult,
    explore,
    explore_exhaustive,
    selected_pairs,
)
from engine.explore.result import CODES, RULES, SPACE_AT_LEAST, SPACE_ESTIMATE, SPACE_EXACT, render_trace
from engine.explore.scenario import FINDINGS, SCENARIOS, Scenario, scenario_named
from engine.model import Protocol

EXIT_OK = 0
EXIT_DIVERGENT = 1
EXIT_USAGE = 2
EXIT_CAPPED = 3
"""``--exhaustive``: no divergence, but at least one pair ended neither exhausted nor at the limit."""

DEFAULT_PERMUTATIONS = 10_000


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from exc
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="finality explore",
        description="Explore the interleavings of caller, executor, server and network for each race "
        "scenario and protocol, and report every run whose terminal diverges from the server's truth.",
        epilog=f"exit {EXIT_OK}: no divergence; {EXIT_DIVERGENT}: a divergent interleaving (the shortest "
        f"printed, with the command that replays it); {EXIT_USAGE}: usage; {EXIT_CAPPED}: --exhaustive, "
        "nothing diverged, but a pair was capped (neither exhausted nor proven at least --space-limit)",
    )
    parser.add_argument(
        "--code",
        default="shipped",
        choices=CODES,
        help="shipped (the default and only one): the real driver and protocol adapters against the "
        "reference servers",
    )
    parser.add_argument(
        "--replay",
        metavar="SCENARIO@PROTOCOL:CHOICES",
        help="run one interleaving again by its choices (as a failing trace prints them) and print its "
        "timeline; a trailing ':duckdb' runs it on the DuckDB ledger",
    )
    parser.add_argument(
        "--permutations",
        type=_positive,
        default=None,
        metavar="N",
        help="runs in total across the selected scenarios; with --strategy merge every run also covers "
        f"the interleavings merged with it, counted as distinct interleavings (default {DEFAULT_PERMUTATIONS})",
    )
    parser.add_argument(
        "--exhaustive",
        action="store_true",
        help="no shared budget: search every pair (merging equal states) until its tree is exhausted "
        "(its space then exact) or it has covered --space-limit distinct interleavings (its space then "
        "proven at least that); a pair that hits --pair-runs or --pair-seconds first ends neither way, "
        f"is flagged CAPPED and the exit code is {EXIT_CAPPED} (if nothing diverged)",
    )
    parser.add_argument(
        "--space-limit",
        type=_positive,
        default=None,
        metavar="N",
        help=f"with --exhaustive: interleavings covered that prove a pair large (default {SPACE_LIMIT:,})",
    )
    parser.add_argument(
        "--pair-runs",
        type=_positive,
        default=None,
        metavar="N",
        help=f"with --exhaustive: runs one pair may take (default {PAIR_RUNS:,})",
    )
    parser.add_argument(
        "--pair-seconds",
        type=_seconds,
        default=None,
        metavar="S",
        help="with --exhaustive: seconds one pair's search may take (default: no limit)",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="a scenario name, or 'all' (the default); repeat to select several",
    )
    parser.add_argument(
        "--pair",
        action="append",
        metavar="SCENARIO@PROTOCOL",
        help="one scenario under one protocol (e.g. the pairs an --exhaustive run capped, again with "
        "a larger cap); repeat to select several; with --scenario, both are run",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed of the sampling order (default 0)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--ledger", metavar="PATH", help="record one explorer run per scenario and protocol")
    parser.add_argument(
        "--strategy",
        default="merge",
        choices=STRATEGIES,
        help="merge (the default): depth-first with equal states merged, exhaustive where the budget "
        "allows; sample/dfs: one full run per interleaving, in seeded random or index order",
    )
    parser.add_argument("--max-steps", type=_positive, default=MAX_STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--list", action="store_true", help="list the scenarios, then exit")
    return parser


def _select(names: Sequence[str] | None) -> list[Scenario]:
    """The scenarios named (``all``: the whole catalogue; FINDINGS only by name).

    Raises:
        KeyError: a name matches no scenario.
    """
    if not names or "all" in names:
        chosen = list(SCENARIOS)
        extra = [n for n in (names or ()) if n != "all"]
    else:
        chosen, extra = [], list(names)
    known = {s.name: s for s in (*SCENARIOS, *FINDINGS)}
    for name in extra:
        if name not in known:
            raise KeyError(name)
        if known[name] not in chosen:
            chosen.append(known[name])
    return chosen


def _pair(spec: str) -> tuple[Scenario, Protocol]:
    """``SCENARIO@PROTOCOL`` as a pair.

    Raises:
        KeyError: no scenario has that name.
        ValueError: no such protocol, or the scenario does not list it.
    """
    name, _, protocol_name = spec.partition("@")
    scenario = scenario_named(name)
    protocol = Protocol(protocol_name)
    if protocol not in scenario.protocols:
        raise ValueError(f"{name} runs on {', '.join(scenario.protocols)}, not {protocol_name!r}")
    return scenario, protocol


def _listing(out: TextIO) -> None:
    print("scenarios (run by 'all'):", file=out)
    for s in SCENARIOS:
        print(f"  {s.name:<26} {', '.join(s.protocols)}: {s.summary}", file=out)
    print("open findings (run by name only; they diverge until the engine is fixed):", file=out)
    for s in FINDINGS:
        print(f"  {s.name:<26} {', '.join(s.protocols)}: {s.summary}", file=out)


SMALL_SPACE = SPACE_LIMIT
"""Pairs with fewer interleavings than this must be explored exhaustively (issue 15)."""


def _space(r: PairResult) -> str:
    """The pair's size: the exact count when exhaustive, ``>=`` a proven lower bound when it stopped
    at the space limit, ``~`` an estimate when sampled."""
    if r.space is None:
        return "?"
    if r.space_kind == SPACE_EXACT:
        return f"{int(r.space):,}"
    if r.space_kind == SPACE_AT_LEAST:
        return f">={int(r.space):,}"
    return f"~{r.space:.1e}"


def ending(r: PairResult, exhaustive_mode: bool = False) -> str:
    """How a pair's search ended: ``exhaustive`` (every interleaving covered), ``at-limit``
    (``--exhaustive``: the space limit covered, so the space is at least that), ``capped``
    (``--exhaustive``: a run or time cap came first, neither), ``sampled`` (the shared budget ended)."""
    if r.exhaustive:
        return "exhaustive"
    if r.space_kind == SPACE_AT_LEAST:
        return "at-limit"
    return "capped" if exhaustive_mode else "sampled"


def _capped(results: Sequence[PairResult], exhaustive_mode: bool) -> list[PairResult]:
    return [r for r in results if ending(r, exhaustive_mode) == "capped"]


def _row(r: PairResult, exhaustive_mode: bool = False) -> str:
    mode = ending(r, exhaustive_mode)
    mode = mode.upper() if mode == "capped" else mode
    return (
        f"{r.scenario:<26} {r.protocol:<15} {r.explored:>19,} {r.runs:>7,} {mode:<10} {_space(r):>12} "
        f"{r.receipts:>19,} {r.parked:>17,} {r.divergent:>15,}"
    )


def _small_sampled(results: Sequence[PairResult]) -> list[PairResult]:
    """Sampled pairs whose space is estimated under ``SMALL_SPACE``."""
    return [
        r for r in results if r.space_kind == SPACE_ESTIMATE and r.space is not None and r.space < SMALL_SPACE
    ]


def _shortest(results: Sequence[PairResult]) -> PairResult | None:
    failing = [r for r in results if r.shortest is not None]
    return min(failing, key=lambda r: len(r.shortest.choices) if r.shortest else 0, default=None)


def _space_method(r: PairResult) -> str | None:
    if r.space_kind == SPACE_EXACT:
        return "exact"
    if r.space_kind == SPACE_AT_LEAST:
        return "at least: the distinct interleavings covered when the space limit was reached"
    if r.space_kind == SPACE_ESTIMATE:
        return f"Knuth random probes ({r.space_probes})"
    return None


def _as_json(
    results: Sequence[PairResult],
    rules: str,
    seed: int,
    requested: int | None,
    seconds: float,
    code: str = "shipped",
    exhaustive: dict[str, object] | None = None,
) -> str:
    explored = sum(r.explored for r in results)
    shortest = _shortest(results)
    mode = exhaustive is not None

    def named(which: str) -> list[str]:
        return [f"{r.scenario}@{r.protocol.value}" for r in results if ending(r, mode) == which]

    doc = {
        "code": code,
        "rules": rules,
        "seed": seed,
        "mode": "exhaustive" if mode else "budget",
        "permutations": requested,
        "exhaustive_mode": exhaustive,
        "explored": explored,
        "distinct_interleavings": explored,
        "runs": sum(r.runs for r in results),
        "divergent": sum(r.divergent for r in results),
        "seconds": round(seconds, 3),
        "interleavings_per_second": round(explored / seconds, 1) if seconds > 0 else None,
        "runs_per_second": round(sum(r.runs for r in results) / seconds, 1) if seconds > 0 else None,
        "pairs": [
            {
                "scenario": r.scenario,
                "protocol": r.protocol.value,
                "explored": r.explored,
                "distinct_interleavings": r.explored,
                "runs": r.runs,
                "exhaustive": r.exhaustive,
                "ending": ending(r, mode),
                "space": None if r.space is None else round(r.space),
                "space_kind": r.space_kind,
                "space_estimated": r.space_kind == SPACE_ESTIMATE,
                "space_method": _space_method(r),
                "space_under_1m": None
                if r.space is None or r.space_kind == SPACE_AT_LEAST
                else r.space < SMALL_SPACE,
                "seconds": round(r.seconds, 3),
                "states": r.states,
                "receipts": r.receipts,
                "parked": r.parked,
                "divergent": r.divergent,
                "kinds": {str(k): v for k, v in r.kinds.items()},
                "shortest_trace": r.trace,
            }
            for r in results
        ],
        "shortest_trace": shortest.trace if shortest else None,
        "small_spaces_sampled": [f"{r.scenario}@{r.protocol.value}" for r in _small_sampled(results)],
        "exhausted": named("exhaustive"),
        "at_limit": named("at-limit"),
        "capped": named("capped"),
    }
    return json.dumps(doc, indent=2)


def _record(path: str, results: Sequence[PairResult], started: datetime, finished: datetime) -> None:
    # Imported here: the ledger pulls in the database driver, which a plain run does not need.
    from engine.ledger.duckdb import Ledger
    from engine.ledger.port import ExplorerRun
    from engine.revision import running_revision

    revision = running_revision()
    with Ledger.open(path) as ledger:
        for r in results:
            ledger.record_explorer_run(
                ExplorerRun(
                    scenario=r.scenario,
                    protocol=r.protocol.value,
                    seed=r.seed,
                    explored=r.runs,
                    distinct_interleavings=r.explored,
                    divergent=r.divergent,
                    exhaustive=r.exhaustive,
                    rules=r.rules,
                    shortest_trace=r.trace,
                    started_at=started,
                    finished_at=finished,
                    code=r.code,
                    revision=revision,
                    space=r.space,
                    space_kind=r.space_kind,
                )
            )


DRIVER_LOGGER = "engine.runtime.driver"
"""The shipped driver's logger: every explored run is a whole operation's life, so what it logs is
counted while the explorer runs and summed up once at the end, not printed run after run."""


@contextlib.contextmanager
def _driver_log_counted(err: TextIO) -> Iterator[None]:
    """While exploring, count the driver's log records by message template instead of printing each;
    then print one line per template with its count (an exhaustive pair logged ~900 identical lines)."""
    counts: Counter[tuple[str, str]] = Counter()

    def count(record: logging.LogRecord) -> bool:
        counts[(record.levelname, str(record.msg))] += 1
        return False

    driver = logging.getLogger(DRIVER_LOGGER)
    driver.addFilter(count)
    try:
        yield
    finally:
        driver.removeFilter(count)
        for (level, template), n in sorted(counts.items(), key=lambda kv: -kv[1]):
            print(f"finality explore: the shipped driver logged {n:,} x {level}: {template!r}", file=err)


def main(argv: list[str], *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``finality explore`` with ``argv`` (the words after ``explore``); return the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code == 0 else EXIT_USAGE
    if args.list:
        _listing(out)
        return EXIT_OK
    if args.replay:
        return _replay(args.replay, out, err)
    try:
        scenarios = _select(args.scenario) if args.scenario or not args.pair else []
        pairs = [*selected_pairs(scenarios), *(_pair(spec) for spec in args.pair or ())]
    except ValueError as exc:
        print(
            f"finality explore: --pair wants SCENARIO@PROTOCOL, a protocol the scenario lists: {exc}",
            file=err,
        )
        return EXIT_USAGE
    except KeyError as exc:
        names = ", ".join(s.name for s in (*SCENARIOS, *FINDINGS))
        print(
            f"finality explore: unknown scenario {exc.args[0]!r}; choose 'all' or one of: {names}", file=err
        )
        return EXIT_USAGE
    exhaustive: dict[str, object] | None = None
    if args.exhaustive:
        if args.permutations is not None or args.strategy != "merge":
            print(
                "finality explore: --exhaustive shares no budget and merges equal states: "
                "it takes --pair-runs / --pair-seconds, not --permutations or --strategy",
                file=err,
            )
            return EXIT_USAGE
        exhaustive = {
            "space_limit": SPACE_LIMIT if args.space_limit is None else args.space_limit,
            "pair_runs": PAIR_RUNS if args.pair_runs is None else args.pair_runs,
            "pair_seconds": args.pair_seconds,
        }
    elif (args.space_limit, args.pair_runs, args.pair_seconds) != (None, None, None):
        print(
            "finality explore: --space-limit, --pair-runs and --pair-seconds go with --exhaustive", file=err
        )
        return EXIT_USAGE
    permutations = DEFAULT_PERMUTATIONS if args.permutations is None else args.permutations
    clock = SystemClock()
    started_at = clock.now()
    started = monotonic_seconds()
    with _driver_log_counted(err):
        if exhaustive is not None:

            def progress(r: PairResult) -> None:
                print(
                    f"finality explore: {r.scenario}@{r.protocol} {ending(r, True)}: {r.explored:,} "
                    f"interleavings, {r.runs:,} runs, space {_space(r)}, {r.seconds:.1f} s",
                    file=err,
                    flush=True,
                )

            results = explore_exhaustive(
                pairs,
                limit=int(str(exhaustive["space_limit"])),
                pair_runs=int(str(exhaustive["pair_runs"])),
                pair_seconds=args.pair_seconds,
                seed=args.seed,
                max_steps=args.max_steps,
                progress=progress,
            )
        else:
            results = explore(
                pairs,
                permutations=permutations,
                seed=args.seed,
                strategy=args.strategy,
                max_steps=args.max_steps,
                code=args.code,
            )
    seconds = monotonic_seconds() - started
    finished_at = clock.now()
    if args.ledger:
        try:
            _record(args.ledger, results, started_at, finished_at)
        except (EngineError, OSError) as exc:
            print(f"finality explore: cannot record in {args.ledger}: {exc}", file=err)
            return EXIT_USAGE
    divergent = sum(r.divergent for r in results)
    requested = None if args.exhaustive else permutations
    if args.json:
        print(_as_json(results, RULES, args.seed, requested, seconds, args.code, exhaustive), file=out)
    else:
        _print_table(results, RULES, args.seed, seconds, out, args.code, exhaustive)
    if divergent:
        return EXIT_DIVERGENT
    return EXIT_CAPPED if _capped(results, args.exhaustive) else EXIT_OK


def _print_table(
    results: Sequence[PairResult],
    rules: str,
    seed: int,
    seconds: float,
    out: TextIO,
    code: str = "shipped",
    exhaustive: dict[str, object] | None = None,
) -> None:
    explored = sum(r.explored for r in results)
    divergent = sum(r.divergent for r in results)
    print(f"finality explore: {code} code, rules {rules}, seed {seed}", file=out)
    print(
        f"{'scenario':<26} {'protocol':<15} {'interleavings':>19} {'runs':>7} {'mode':<10} {'space':>12} "
        f"{'receipts':>19} {'parked':>17} {'divergent':>15}",
        file=out,
    )
    mode = exhaustive is not None
    for r in results:
        print(_row(r, mode), file=out)
    exhausted = sum(r.exhaustive for r in results)
    runs = sum(r.runs for r in results)
    rate = f"{explored / seconds:,.0f} interleavings/s ({runs / seconds:,.0f} runs/s)" if seconds > 0 else ""
    print(
        f"{divergent:,} divergent of {explored:,} distinct interleavings, {runs:,} runs "
        f"({exhausted} of {len(results)} scenario/protocol pairs exhaustive) in {seconds:.1f} s, {rate}",
        file=out,
    )
    if exhaustive is not None:
        _print_exhaustive(results, int(str(exhaustive["space_limit"])), out)
    else:
        _print_spaces(results, out)
    for r in results:
        if r.divergent:
            kinds = ", ".join(f"{k}: {v}" for k, v in sorted(r.kinds.items()))
            print(f"DIVERGENT {r.scenario} on {r.protocol}: {r.divergent} runs ({kinds})", file=out)
    shortest = _shortest(results)
    if shortest is not None and shortest.trace and shortest.shortest is not None:
        print("\nshortest failing interleaving:", file=out)
        print(shortest.trace, file=out)
        print(f"\nreplay it: {replay_command(shortest)}", file=out)


def _print_spaces(results: Sequence[PairResult], out: TextIO) -> None:
    """The budget run's word on the spaces: which sampled pairs are estimated under the limit."""
    small = _small_sampled(results)
    unknown = sum(r.space is None for r in results)
    print(
        "space: the interleavings of a pair, exact when exhaustive, ~ an estimate when sampled "
        "(Knuth's random probes over the merged tree, not a bound; --exhaustive settles it); "
        + (
            f"the space of {unknown} pairs is not known (only --strategy merge estimates it)"
            if unknown
            else f"every pair under {SMALL_SPACE:,} is exhaustive"
            if not small
            else f"sampled though estimated under {SMALL_SPACE:,}: "
            + ", ".join(f"{r.scenario}@{r.protocol}" for r in small)
        ),
        file=out,
    )


def _print_exhaustive(results: Sequence[PairResult], limit: int, out: TextIO) -> None:
    """``--exhaustive``'s verdict: which pairs are exact, which proven at least the limit, which neither."""
    at_limit = [r for r in results if ending(r, True) == "at-limit"]
    capped = _capped(results, True)
    print(
        f"exhaustive mode: {sum(r.exhaustive for r in results)} pairs exhausted (space exact), "
        f"{len(at_limit)} covered {limit:,} interleavings without exhausting (space proven >= {limit:,}), "
        f"{len(capped)} capped",
        file=out,
    )
    if capped:
        print(
            f"CAPPED (a run or time cap came first: neither exhausted nor proven >= {limit:,}, so "
            "whether it is under the limit is not known): "
            + ", ".join(f"{r.scenario}@{r.protocol} ({r.stopped}, {r.explored:,} covered)" for r in capped),
            file=out,
        )
    else:
        print(f"every pair under {limit:,} interleavings is exhaustive", file=out)


def replay_command(result: PairResult) -> str:
    """The one command that runs a pair's shortest failing interleaving again, with its timeline."""
    assert result.shortest is not None
    choices = ",".join(str(c) for c in result.shortest.choices)
    ledger = "" if result.shortest.ledger == "memory" else f":{result.shortest.ledger}"
    return f"finality explore --code {result.code} --replay {result.scenario}@{result.protocol}:{choices}{ledger}"


def _replay(spec: str, out: TextIO, err: TextIO) -> int:
    """``--replay SCENARIO@PROTOCOL:CHOICES``: the timeline of one interleaving; exit 1 if it diverges."""
    try:
        head, _, tail = spec.partition(":")
        name, _, protocol_name = head.partition("@")
        scenario = scenario_named(name)
        protocol = Protocol(protocol_name)
        tail, _, ledger = tail.partition(":")
        ledger = ledger or "memory"
        choices = [int(c) for c in tail.split(",") if c.strip()]
    except (KeyError, ValueError) as exc:
        print(
            f"finality explore: --replay wants SCENARIO@PROTOCOL:CHOICES (e.g. happy@aip-151:0,0,1): {exc}",
            file=err,
        )
        return EXIT_USAGE
    try:
        trace = render_trace(scenario, protocol, choices, ledger=ledger)
    except (IndexError, ValueError) as exc:
        print(f"finality explore: those choices do not replay on this code: {exc}", file=err)
        return EXIT_USAGE
    print(trace, file=out)
    return EXIT_DIVERGENT if "DIVERGENCE" in trace else EXIT_OK


__all__ = [
    "DEFAULT_PERMUTATIONS",
    "EXIT_CAPPED",
    "EXIT_DIVERGENT",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "ending",
    "main",
    "replay_command",
]
