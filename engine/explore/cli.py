"""``finality explore``: run the race explorer, print what it found, exit 1 on any divergence.

Usage: ``finality explore [--permutations N] [--scenario NAME|all] [--seed S] [--json] [--ledger PATH]
[--strategy merge|sample|dfs] [--replay SCENARIO@PROTOCOL:CHOICES[:duckdb]] [--list]``.
Exit codes: 0 no divergence,
1 at least one divergent interleaving (the shortest is printed as a trace), 2 usage error.
Presentation only: the rules live in ``engine.machine`` and the explorer in ``engine.explore``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TextIO

from engine.clock import SystemClock, monotonic_seconds
from engine.errors import EngineError
from engine.explore.explorer import MAX_STEPS, STRATEGIES, PairResult, explore, selected_pairs
from engine.explore.result import CODES, RULES, render_trace
from engine.explore.scenario import FINDINGS, SCENARIOS, Scenario, scenario_named
from engine.model import Protocol

EXIT_OK = 0
EXIT_DIVERGENT = 1
EXIT_USAGE = 2

DEFAULT_PERMUTATIONS = 10_000


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="finality explore",
        description="Explore the interleavings of caller, executor, server and network for each race "
        "scenario and protocol, and report every run whose terminal diverges from the server's truth.",
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
        default=DEFAULT_PERMUTATIONS,
        metavar="N",
        help="runs in total across the selected scenarios; with --strategy merge every run also covers "
        f"the interleavings merged with it, counted as distinct interleavings (default {DEFAULT_PERMUTATIONS})",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="a scenario name, or 'all' (the default); repeat to select several",
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


def _listing(out: TextIO) -> None:
    print("scenarios (run by 'all'):", file=out)
    for s in SCENARIOS:
        print(f"  {s.name:<26} {', '.join(s.protocols)}: {s.summary}", file=out)
    print("open findings (run by name only; they diverge until the engine is fixed):", file=out)
    for s in FINDINGS:
        print(f"  {s.name:<26} {', '.join(s.protocols)}: {s.summary}", file=out)


SMALL_SPACE = 1_000_000
"""Pairs with fewer interleavings than this must be explored exhaustively (issue 15)."""


def _space(r: PairResult) -> str:
    """The pair's size: the exact count when exhaustive, ``~`` an estimate when sampled."""
    if r.space is None:
        return "?"
    if r.exhaustive:
        return f"{int(r.space):,}"
    return f"~{r.space:.1e}"


def _row(r: PairResult) -> str:
    mode = "exhaustive" if r.exhaustive else "sampled"
    return (
        f"{r.scenario:<26} {r.protocol:<15} {r.explored:>19,} {r.runs:>7,} {mode:<10} {_space(r):>12} "
        f"{r.receipts:>19,} {r.parked:>17,} {r.divergent:>15,}"
    )


def _small_sampled(results: Sequence[PairResult]) -> list[PairResult]:
    """Sampled pairs whose space is estimated under ``SMALL_SPACE``."""
    return [r for r in results if not r.exhaustive and r.space is not None and r.space < SMALL_SPACE]


def _shortest(results: Sequence[PairResult]) -> PairResult | None:
    failing = [r for r in results if r.shortest is not None]
    return min(failing, key=lambda r: len(r.shortest.choices) if r.shortest else 0, default=None)


def _as_json(
    results: Sequence[PairResult],
    rules: str,
    seed: int,
    requested: int,
    seconds: float,
    code: str = "shipped",
) -> str:
    explored = sum(r.explored for r in results)
    shortest = _shortest(results)
    doc = {
        "code": code,
        "rules": rules,
        "seed": seed,
        "permutations": requested,
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
                "space": None if r.space is None else (int(r.space) if r.exhaustive else round(r.space)),
                "space_estimated": not r.exhaustive,
                "space_method": "exact" if r.exhaustive else f"Knuth random probes ({r.space_probes})",
                "space_under_1m": None if r.space is None else r.space < SMALL_SPACE,
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
                )
            )


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
        scenarios = _select(args.scenario)
    except KeyError as exc:
        names = ", ".join(s.name for s in (*SCENARIOS, *FINDINGS))
        print(
            f"finality explore: unknown scenario {exc.args[0]!r}; choose 'all' or one of: {names}", file=err
        )
        return EXIT_USAGE
    clock = SystemClock()
    started_at = clock.now()
    started = monotonic_seconds()
    pairs = selected_pairs(scenarios)
    results = explore(
        pairs,
        permutations=args.permutations,
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
    if args.json:
        print(_as_json(results, RULES, args.seed, args.permutations, seconds, args.code), file=out)
    else:
        _print_table(results, RULES, args.seed, seconds, out, args.code)
    return EXIT_DIVERGENT if divergent else EXIT_OK


def _print_table(
    results: Sequence[PairResult], rules: str, seed: int, seconds: float, out: TextIO, code: str = "shipped"
) -> None:
    explored = sum(r.explored for r in results)
    divergent = sum(r.divergent for r in results)
    print(f"finality explore: {code} code, rules {rules}, seed {seed}", file=out)
    print(
        f"{'scenario':<26} {'protocol':<15} {'interleavings':>19} {'runs':>7} {'mode':<10} {'space':>12} "
        f"{'receipts':>19} {'parked':>17} {'divergent':>15}",
        file=out,
    )
    for r in results:
        print(_row(r), file=out)
    exhausted = sum(r.exhaustive for r in results)
    runs = sum(r.runs for r in results)
    rate = f"{explored / seconds:,.0f} interleavings/s ({runs / seconds:,.0f} runs/s)" if seconds > 0 else ""
    print(
        f"{divergent:,} divergent of {explored:,} distinct interleavings, {runs:,} runs "
        f"({exhausted} of {len(results)} scenario/protocol pairs exhaustive) in {seconds:.1f} s, {rate}",
        file=out,
    )
    small = _small_sampled(results)
    unknown = sum(r.space is None for r in results)
    print(
        "space: the interleavings of a pair, exact when exhaustive, ~ an estimate when sampled "
        "(Knuth's random probes over the merged tree); "
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
    for r in results:
        if r.divergent:
            kinds = ", ".join(f"{k}: {v}" for k, v in sorted(r.kinds.items()))
            print(f"DIVERGENT {r.scenario} on {r.protocol}: {r.divergent} runs ({kinds})", file=out)
    shortest = _shortest(results)
    if shortest is not None and shortest.trace and shortest.shortest is not None:
        print("\nshortest failing interleaving:", file=out)
        print(shortest.trace, file=out)
        print(f"\nreplay it: {replay_command(shortest)}", file=out)


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
    "EXIT_DIVERGENT",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "main",
    "replay_command",
]
