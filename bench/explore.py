"""Race explorer throughput: distinct interleavings per second across every scenario and protocol.

Each run explores --permutations interleavings of the whole catalogue from a cold start (memoised
transitions forgotten), exactly what ``finality explore`` does. Reported: the median of --runs runs,
with min and max, by wall clock and by process CPU time (the latter is steadier on a shared machine).

    python bench/explore.py [--runs 5] [--permutations 10000] [--seed 0] [--code shipped|model] [--json]
    python bench/explore.py --prune [--runs 1] [--json]
    python bench/explore.py --compare [--runs 3] [--permutations 1000]

``--code shipped`` runs the real driver and adapters against the reference servers (what ``finality
explore`` runs by default); ``model`` the explorer's simulated executor and servers. ``--compare``
measures both in the same run, alternating, and reports the shipped code's rate against the model's.

``--prune`` instead explores every interleaving of the whole catalogue with equivalent
interleavings merged (each distinct state run once) and reports interleavings covered per second.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.figures import Report
from engine.explore import SCENARIOS, explore, selected_pairs


def one_run(
    permutations: int, seed: int, prune: bool, code: str = "model"
) -> tuple[int, int, float, float, int]:
    """(interleavings, divergent, wall seconds, cpu seconds, states) of one cold exploration."""
    pairs = selected_pairs(SCENARIOS)
    wall, cpu = time.perf_counter(), time.process_time()
    results = explore(pairs, permutations=permutations, seed=seed, code=code)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    explored = sum(r.explored for r in results)
    return explored, sum(r.divergent for r in results), wall, cpu, sum(r.states for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--permutations", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--prune", action="store_true", help="merge equivalent interleavings, explore everything"
    )
    parser.add_argument("--code", default="model", choices=("model", "shipped"))
    parser.add_argument("--compare", action="store_true", help="shipped and model in the same run")
    args = parser.parse_args()
    if args.compare:
        return compare(args.runs, args.permutations, args.seed)
    runs = [one_run(args.permutations, args.seed, args.prune, args.code) for _ in range(args.runs)]
    explored, states = runs[0][0], runs[0][4]
    name = "explore --prune" if args.prune else "explore"
    command = f"python bench/explore.py --runs {args.runs} " + (
        "--prune" if args.prune else f"--permutations {args.permutations} --seed {args.seed}"
    )
    report = Report(name.replace(" --", "_"), command)
    wall = report.add("interleavings/s (wall clock)", "interleavings/s", [r[0] / r[2] for r in runs])
    cpu = report.add("interleavings/s (process CPU)", "interleavings/s", [r[0] / r[3] for r in runs])
    secs = report.add("seconds per exploration", "s", [r[2] for r in runs], better="lower")
    report.add("divergent interleavings", "interleavings", [r[1] for r in runs], better="lower")
    what = (
        f"every interleaving, equivalent ones merged ({states:,} distinct states run)"
        if args.prune
        else (f"{args.permutations:,} sampled interleavings (seed {args.seed})")
    )
    report.notes.append(
        f"Each run explores {what} of the whole scenario catalogue from a cold start (memoised "
        f"transitions forgotten), as `finality explore` does: {explored:,} distinct interleavings per run. "
        "CPU-time rates are steadier than wall-clock ones on a shared machine."
    )
    if args.json:
        report.emit()
    else:
        divergent = max(r[1] for r in runs)
        print(f"{name}: {explored:,} distinct interleavings per run, {args.runs} runs, {divergent} divergent")
        for figure in (wall, cpu, secs):
            print(
                f"  {figure.name:32s} median {figure.median:,.2f}  "
                f"min {min(figure.runs):,.2f}  max {max(figure.runs):,.2f}"
            )
    return 0


def compare(runs: int, permutations: int, seed: int) -> int:
    """The shipped code's and the model's interleavings/s, alternating runs on the same machine."""
    rates: dict[str, list[float]] = {"shipped": [], "model": []}
    seconds: dict[str, list[float]] = {"shipped": [], "model": []}
    divergent = {"shipped": 0, "model": 0}
    for _ in range(runs):
        for code in ("shipped", "model"):
            explored, bad, wall, _, _ = one_run(permutations, seed, False, code)
            rates[code].append(explored / wall)
            seconds[code].append(wall)
            divergent[code] += bad
    for code in ("shipped", "model"):
        ordered = sorted(rates[code])
        print(
            f"{code:8s} {permutations:,} interleavings per run, {runs} runs: median "
            f"{ordered[len(ordered) // 2]:,.1f} interleavings/s (min {ordered[0]:,.1f}, max {ordered[-1]:,.1f}), "
            f"median {sorted(seconds[code])[len(ordered) // 2]:.1f} s per run, {divergent[code]} divergent"
        )
    ratio = sorted(rates["model"])[runs // 2] / sorted(rates["shipped"])[runs // 2]
    print(f"the model runs {ratio:,.0f}x as many interleavings per second as the shipped code")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
