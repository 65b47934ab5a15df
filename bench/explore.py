"""Race explorer throughput over the shipped code: interleavings covered and runs per second.

Each run is what ``finality explore --permutations N`` does over the whole scenario catalogue: a
budget of N runs of the real driver and adapters against the reference servers, shared across the
scenario/protocol pairs, with equal states merged (``--strategy merge``, the default) or one full
run per interleaving (``--strategy sample``). Reported: the median of --runs runs, with min and
max, by wall clock and by process CPU time (steadier on a shared machine), and how many pairs
were explored exhaustively.

    python bench/explore.py [--runs 3] [--permutations 1000] [--strategy merge|sample] [--json]
    python bench/explore.py --compare [--runs 3] [--permutations 1000]

``--compare`` also measures, in the same run and alternating with the current code, two baselines
checked out of git into a temporary directory (``git archive``) and run by their own
``bench/explore.py`` in a child process: the shipped-code explorer as it was before the speed work
(``SHIPPED_BEFORE``, same budget of runs) and the explorer's old model copy (``MODEL_REVISION``,
the last commit that had it; 10,000 interleavings). Without git history the recorded model figure
(``MODEL_RECORDED``) is quoted instead, and said so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.figures import Report
from engine.explore import SCENARIOS, explore, selected_pairs
from service.explore_seat import plug_into_the_explorer

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_BEFORE = "bb95f3109e5abe9007a268d7810cf23d6085d32c"
"""The last commit before the shipped explorer's speed work (every run rebuilt the server app)."""
MODEL_REVISION = "78b312f03df9549954365657f00c790857cb8bfc"
"""The last commit with the model copy (``--code model``: SimExecutor against engine-value servers)."""
MODEL_RECORDED = 3_080.0
"""The model's interleavings/s as issue 15 recorded it (quoted only when git cannot check it out)."""


def cpu_seconds() -> float:
    """This process's CPU time and its ended children's: the merging search forks a copy of the
    process for deep branches (engine/explore/prune.py), and their CPU is the exploration's too."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


plug_into_the_explorer()  # the group scenarios run the service executor


def one_run(permutations: int, seed: int, strategy: str) -> dict[str, float]:
    """One cold exploration of the whole catalogue (a fresh process's caches aside)."""
    pairs = selected_pairs(SCENARIOS)
    wall, cpu = time.perf_counter(), cpu_seconds()
    results = explore(pairs, permutations=permutations, seed=seed, strategy=strategy)
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    return {
        "interleavings": sum(r.explored for r in results),
        "runs": sum(r.runs for r in results),
        "divergent": sum(r.divergent for r in results),
        "exhaustive": sum(r.exhaustive for r in results),
        "pairs": len(results),
        "wall": wall,
        "cpu": cpu,
    }


def _checkout(revision: str, into: Path) -> bool:
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", revision], capture_output=True, check=True, timeout=120
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return True


def _old_bench(tree: Path, code: str, permutations: int) -> dict[str, float] | None:
    """One run of an old revision's own bench/explore.py; its wall and CPU interleavings/s."""
    try:
        done = subprocess.run(
            [
                sys.executable,
                "bench/explore.py",
                *("--code", code, "--runs", "1", "--permutations", str(permutations), "--json"),
            ],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=3600,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    figures = {f["name"]: f["median"] for f in doc["figures"]}
    return {
        "wall_rate": figures["interleavings/s (wall clock)"],
        "cpu_rate": figures["interleavings/s (process CPU)"],
        "seconds": figures["seconds per exploration"],
    }


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--permutations", type=int, default=1_000, help="runs per exploration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategy", default="merge", choices=("merge", "sample"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--compare", action="store_true", help="also the two baselines, same run")
    args = parser.parse_args()
    baselines: dict[str, list[dict[str, float]]] = {"before": [], "model": []}
    runs, loads = [], []
    with tempfile.TemporaryDirectory(prefix="explore-bench-") as folder:
        trees: dict[str, Path] = {}
        if args.compare:
            for name, revision in (("before", SHIPPED_BEFORE), ("model", MODEL_REVISION)):
                tree = Path(folder) / name
                tree.mkdir()
                if _checkout(revision, tree):
                    trees[name] = tree
        for _ in range(args.runs):
            loads.append(_load())
            runs.append(one_run(args.permutations, args.seed, args.strategy))
            if "before" in trees and (got := _old_bench(trees["before"], "shipped", args.permutations)):
                baselines["before"].append(got)
            if "model" in trees and (got := _old_bench(trees["model"], "model", 10_000)):
                baselines["model"].append(got)
    first = runs[0]
    report = Report(
        "explore",
        f"python bench/explore.py --runs {args.runs} --permutations {args.permutations} "
        f"--strategy {args.strategy}" + (" --compare" if args.compare else ""),
    )
    report.add(
        "interleavings covered/s (wall clock)",
        "interleavings/s",
        [r["interleavings"] / r["wall"] for r in runs],
    )
    before_name = "shipped before the speed work: interleavings/s (process CPU)"
    model_name = "old model copy: interleavings/s (process CPU)"
    covered_cpu = report.add(
        "interleavings covered/s (process CPU)",
        "interleavings/s",
        [r["interleavings"] / r["cpu"] for r in runs],
        baseline=before_name if baselines["before"] else None,
    )
    runs_cpu = report.add(
        "runs/s (process CPU)",
        "runs/s",
        [r["runs"] / r["cpu"] for r in runs],
        baseline=before_name if baselines["before"] else None,
    )
    if baselines["model"]:
        report.add(
            "interleavings covered/s (process CPU), against the model",
            "interleavings/s",
            [r["interleavings"] / r["cpu"] for r in runs],
            baseline=model_name,
        )
    secs = report.add("seconds per exploration (wall)", "s", [r["wall"] for r in runs], better="lower")
    report.add("CPU seconds per exploration", "s", [r["cpu"] for r in runs], better="lower")
    report.add("pairs exhaustive", "pairs", [r["exhaustive"] for r in runs])
    report.add("divergent interleavings", "interleavings", [r["divergent"] for r in runs], better="lower")
    lines = []
    medians = {}
    for key, label in (("before", "shipped before the speed work"), ("model", "old model copy")):
        if baselines[key]:
            medians[key] = report.add(
                f"{label}: interleavings/s (process CPU)",
                "interleavings/s",
                [b["cpu_rate"] for b in baselines[key]],
            ).median
            report.add(
                f"{label}: interleavings/s (wall clock)",
                "interleavings/s",
                [b["wall_rate"] for b in baselines[key]],
            )
    if "before" in medians:
        lines.append(
            f"current vs shipped before the speed work (CPU): {covered_cpu.median / medians['before']:,.1f}x "
            f"interleavings covered/s, {runs_cpu.median / medians['before']:,.1f}x runs/s"
        )
    if "model" in medians:
        lines.append(
            f"old model copy (measured at {MODEL_REVISION[:10]}, same run): {medians['model']:,.0f} interleavings/s "
            f"CPU; the shipped code covers {covered_cpu.median / medians['model']:.2f}x as many per CPU second"
        )
    if "model" not in medians and args.compare:
        lines.append(
            f"old model copy not measured (no git history): its recorded figure was {MODEL_RECORDED:,.0f} "
            f"interleavings/s; the shipped code covers {covered_cpu.median / MODEL_RECORDED:.2f}x that per CPU second"
        )
    report.notes.append(
        f"Each run: `finality explore --permutations {args.permutations} --strategy {args.strategy}` over the "
        f"whole catalogue ({first['pairs']} scenario/protocol pairs): {first['runs']:,} runs covering "
        f"{first['interleavings']:,} distinct interleavings, {first['exhaustive']} pairs exhaustive. "
        f"1-minute load average at each run's start: {', '.join(loads)} (2 cores, shared)."
    )
    report.notes.extend(lines)
    if args.json:
        report.emit()
    else:
        print(report.notes[0])
        for figure in report.figures:
            print(
                f"  {figure.name:58s} median {figure.median:,.2f}  min {min(figure.runs):,.2f}  "
                f"max {max(figure.runs):,.2f}"
            )
        for line in lines:
            print(line)
        print(f"median wall {statistics.median(r['wall'] for r in runs):.1f} s ({secs.name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
