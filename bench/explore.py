"""Race explorer throughput: distinct interleavings per second across every scenario and protocol.

Each run explores --permutations interleavings of the whole catalogue from a cold start (memoised
transitions forgotten), exactly what ``finality explore`` does. Reported: the median of --runs runs,
with min and max, by wall clock and by process CPU time (the latter is steadier on a shared machine).

    python bench/explore.py [--runs 5] [--permutations 10000] [--seed 0] [--json]
    python bench/explore.py --prune [--runs 1] [--json]

``--prune`` instead explores every interleaving of the whole catalogue with equivalent
interleavings merged (each distinct state run once) and reports interleavings covered per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.explore import SCENARIOS, explore, selected_pairs
from engine.explore.prune import explore_all_pruned
from engine.explore.rules import clear_caches


def one_run(permutations: int, seed: int, prune: bool) -> tuple[int, int, float, float, int]:
    """(interleavings, divergent, wall seconds, cpu seconds, states) of one cold exploration."""
    clear_caches()
    pairs = selected_pairs(SCENARIOS)
    wall, cpu = time.perf_counter(), time.process_time()
    results = explore_all_pruned(pairs) if prune else explore(pairs, permutations=permutations, seed=seed)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    explored = sum(r.explored for r in results)
    return explored, sum(r.divergent for r in results), wall, cpu, sum(r.states for r in results)


def summary(rates: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(rates), 1),
        "min": round(min(rates), 1),
        "max": round(max(rates), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--permutations", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--prune", action="store_true", help="merge equivalent interleavings, explore everything"
    )
    args = parser.parse_args()
    runs = [one_run(args.permutations, args.seed, args.prune) for _ in range(args.runs)]
    explored = runs[0][0]
    report = {
        "benchmark": "explore --prune" if args.prune else "explore",
        "runs": args.runs,
        "permutations": None if args.prune else args.permutations,
        "explored_per_run": explored,
        "distinct_states_per_run": runs[0][4],
        "divergent": max(r[1] for r in runs),
        "seconds_per_run": summary([r[2] for r in runs]),
        "interleavings_per_second": summary([r[0] / r[2] for r in runs]),
        "interleavings_per_cpu_second": summary([r[0] / r[3] for r in runs]),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        wall = report["interleavings_per_second"]
        cpu = report["interleavings_per_cpu_second"]
        secs = report["seconds_per_run"]
        states = f" ({runs[0][4]:,} distinct states run)" if args.prune else ""
        print(
            f"{report['benchmark']}: {explored:,} distinct interleavings per run{states}, "
            f"{args.runs} runs, {report['divergent']} divergent"
        )
        print(
            f"  interleavings/s (wall): median {wall['median']:,.0f}  min {wall['min']:,.0f}  max {wall['max']:,.0f}"
        )
        print(
            f"  interleavings/s (cpu):  median {cpu['median']:,.0f}  min {cpu['min']:,.0f}  max {cpu['max']:,.0f}"
        )
        print(
            f"  seconds per run:        median {secs['median']:.2f}  min {secs['min']:.2f}  max {secs['max']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
