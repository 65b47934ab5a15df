"""``make bench``: run every benchmark with ``--json`` and gather their reports into bench/results/latest.md.

Each benchmark runs as its own subprocess (own session, so a timeout kills its reference servers
too) and must print a ``bench/figures.py`` report as the last line of stdout. The harness rebuilds
every figure from its runs (median, min and max are computed here again, never copied), and writes

* ``bench/results/latest.md``: per benchmark the exact command that reproduces it, each figure as
  median (min-max) over its runs with the run count, and its ratio to the baseline it names (a
  figure of the same report, measured in the same run);
* ``bench/results/latest.json``: the same, machine-readable, with every run's value.

A benchmark that exits non-zero, times out, or prints no valid report is listed as failed with the
tail of its stderr; it is never dropped. Scripts in bench/ that are not listed in ``BENCHMARKS``
are run too (with plain ``--json``), so a new benchmark cannot be forgotten.

    python bench/run_all.py [--only ledger,pollers] [--quick] [--out bench/results] [--list]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.figures import Figure
from engine.clock import SystemClock

ROOT = Path(__file__).resolve().parents[1]
DASH = "\N{EN DASH}"

MIN_RUNS = 5
# Helpers of the benchmarks, not benchmarks: crashtrial is the kill -9 trial harness bench/restart.py
# and a test share; the fastmcp side and the raw poller of fastmcp_compare.py run as its subprocesses;
# the profiler driver runs by hand (python bench/_profile.py).
NOT_BENCHMARKS = frozenset(
    # mutants.py is `make mutants` (a mutation run, not a benchmark).
    {
        "figures.py",
        "run_all.py",
        "crashtrial.py",
        "mutants.py",
        "_fastmcp_side.py",
        "_raw_poller.py",
        "_profile.py",
    }
)
STDERR_TAIL = 2500


@dataclass(frozen=True)
class Benchmark:
    """One benchmark script and how the harness calls it (``--json`` is always added)."""

    name: str
    script: str
    title: str
    args: tuple[str, ...] = ()
    quick_args: tuple[str, ...] = ()
    timeout_s: float = 1800.0
    quick_timeout_s: float = 600.0

    def command(self, quick: bool) -> list[str]:
        return ["python", self.script, *(self.quick_args if quick else self.args), "--json"]


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "ledger",
        "bench/ledger_commit.py",
        "Ledger: durable transitions per second, per-transition commit vs group commit",
        ("--runs", "5"),
        ("--runs", "2", "--ops", "4000", "--batch", "2000", "--single", "150"),
        timeout_s=900,
    ),
    Benchmark(
        "submit",
        "bench/submit.py",
        "Submission latency: 200 concurrent POST /api/v1/calls to the durable SUBMITTING record",
        ("--runs", "5"),
        ("--runs", "1", "--calls", "50"),
        timeout_s=900,
    ),
    Benchmark(
        "scale",
        "bench/scale.py",
        "10,000 in-flight operations: RSS, CPU per 1,000 requests, busiest 1-second window vs cap, "
        "cancel-confirmation p99",
        ("--runs", "5"),
        ("--runs", "1", "--ops", "1000"),
        timeout_s=3600,
    ),
    Benchmark(
        "pollers",
        "bench/pollers.py",
        "Pollers: protocol requests per completed operation and completion-detection delay, "
        "Finality vs google-api-core-style and fastmcp-style polling on the same server",
        ("--runs", "5"),
        ("--runs", "2", "--quick"),
        timeout_s=900,
    ),
    Benchmark(
        "fastmcp",
        "bench/fastmcp_compare.py",
        "Against the real fastmcp client: status reads, CPU per completed task and completion-detection delay "
        "for 200 concurrent 3 s calls (fastmcp Client, a raw httpx poller, finality serve), each on a fresh "
        "server; also on the 2025-11-25 and AIP-151 reference servers",
        ("--runs", "5"),
        ("--quick",),
        timeout_s=3600,
    ),
    Benchmark(
        "naive",
        "bench/naive_retry.py",
        "Naive 'time out after 30 s, then call again' client vs Finality under the seed's faults",
        ("--runs", "5"),
        ("--runs", "2", "--quick"),
        timeout_s=900,
    ),
    Benchmark(
        "readers",
        "bench/readers.py",
        "The executor while 4 analysts run 10-s queries: poll lateness, health and cancel-confirmation p99 "
        "against the same run without readers (DuckDB ledger)",
        ("--runs", "5"),
        ("--runs", "1", "--ops", "100", "--cancels", "10", "--warmup-s", "3", "--window-s", "12"),
        timeout_s=2400,
    ),
    Benchmark(
        "readers-pg",
        "bench/readers.py",
        "The same on a PostgreSQL ledger (analyst queries under the read-only role, on a pool of their own)",
        ("--runs", "5", "--ledger", "postgres"),
        (
            "--runs",
            "1",
            "--ops",
            "100",
            "--cancels",
            "10",
            "--warmup-s",
            "3",
            "--window-s",
            "12",
            "--ledger",
            "postgres",
        ),
        timeout_s=2400,
    ),
    Benchmark(
        "explore",
        "bench/explore.py",
        "Race explorer over the shipped code: interleavings per second",
        ("--runs", "3", "--permutations", "1000", "--compare"),
        ("--runs", "1", "--permutations", "300"),
        timeout_s=3600,
    ),
    Benchmark(
        "console",
        "bench/console.py",
        "Console: page render time on a 1,000,000-operation ledger",
        ("--runs", "5"),
        ("--runs", "1", "--ops", "20000"),
        timeout_s=3600,
    ),
    Benchmark(
        "pg_scale",
        "bench/pg_scale.py",
        "Several executors on one PostgreSQL ledger: completed operations/s and transitions/s with 1, 2 and 4 "
        "executor processes",
        ("--runs", "5"),
        ("--quick",),
        timeout_s=3600,
    ),
    Benchmark(
        "restart",
        "bench/restart.py",
        "Restart recovery: kill -9 of the service at random points (lost, second operations, double receipts)",
        ("--trials", "100"),
        ("--trials", "6"),
        timeout_s=3600,
    ),
)


@dataclass
class Outcome:
    """What one benchmark's subprocess produced."""

    benchmark: Benchmark
    command: list[str]
    status: str  # "ok" | "failed" | "timeout" | "skipped"
    seconds: float = 0.0
    returncode: int | None = None
    report: dict[str, object] | None = None
    figures: list[Figure] = field(default_factory=list)
    error: str = ""
    stderr_tail: str = ""


# ------------------------------------------------------------------------------------- discovery


def discover(bench_dir: Path, known: Sequence[Benchmark]) -> list[Benchmark]:
    """``known`` plus every other bench/*.py script (run with plain ``--json``)."""
    listed = {Path(b.script).name for b in known}
    extra = [
        Benchmark(path.stem, f"bench/{path.name}", f"{path.name} (not listed in run_all.BENCHMARKS)")
        for path in sorted(bench_dir.glob("*.py"))
        if path.name not in listed and path.name not in NOT_BENCHMARKS and not path.name.startswith("_")
    ]
    return [*known, *extra]


def select(benchmarks: Sequence[Benchmark], only: str | None) -> list[Benchmark]:
    """The benchmarks named in ``only`` (comma-separated names), or all of them.

    Raises:
        SystemExit: a name matches no benchmark (the message lists the names).
    """
    if not only:
        return list(benchmarks)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    names = {b.name for b in benchmarks}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; known: {', '.join(sorted(names))}")
    return [b for b in benchmarks if b.name in wanted]


# ------------------------------------------------------------------------------------------ running


def parse_report(stdout: str) -> tuple[dict[str, object], list[Figure]]:
    """The figures.py report on the last non-empty stdout line, with every figure rebuilt from its runs.

    Raises:
        ValueError: no such line, or it does not have the figures.py shape (the message says why).
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("printed nothing on stdout")
    try:
        report = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"the last stdout line is not JSON ({exc.msg}): {lines[-1][:200]!r}") from exc
    if not isinstance(report, dict):
        raise ValueError("the last stdout line is not a JSON object")
    missing = [key for key in ("benchmark", "command", "figures") if key not in report]
    if missing or not isinstance(report.get("figures"), list):
        raise ValueError(
            f"the last stdout line is not a bench/figures.py report (missing {missing or ['figures list']}); "
            f"keys: {sorted(report)[:12]}"
        )
    figures: list[Figure] = []
    for raw in report["figures"]:
        if not isinstance(raw, dict):
            raise ValueError(f"a figure is not an object: {raw!r}")
        try:
            runs = tuple(float(r) for r in raw["runs"])
            figure = Figure(
                str(raw["name"]),
                str(raw["unit"]),
                runs,
                None if raw.get("baseline") is None else str(raw["baseline"]),
                str(raw.get("better", "higher")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"figure {raw.get('name')!r} is malformed: {exc}") from exc
        figures.append(figure)
    names = {f.name for f in figures}
    dangling = [f"{f.name!r} -> {f.baseline!r}" for f in figures if f.baseline and f.baseline not in names]
    if dangling:
        raise ValueError(f"baselines that name no figure of the same report: {', '.join(dangling)}")
    return report, figures


def run_one(benchmark: Benchmark, *, quick: bool, root: Path = ROOT, python: str = sys.executable) -> Outcome:
    """Run one benchmark to completion or its timeout and read its report."""
    shown = benchmark.command(quick)
    argv = [python, *shown[1:]]
    timeout = benchmark.quick_timeout_s if quick else benchmark.timeout_s
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    started = time.perf_counter()
    process = subprocess.Popen(
        argv,
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        stdout, stderr = process.communicate()
        return Outcome(
            benchmark,
            shown,
            "timeout",
            time.perf_counter() - started,
            process.returncode,
            error=f"did not finish within {timeout:.0f} s (killed with its process group)",
            stderr_tail=_tail(stderr or stdout),
        )
    except BaseException:
        _kill_group(process)
        raise
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        return Outcome(
            benchmark,
            shown,
            "failed",
            seconds,
            process.returncode,
            error=f"exited with status {process.returncode}",
            stderr_tail=_tail(stderr or stdout),
        )
    try:
        report, figures = parse_report(stdout)
    except ValueError as exc:
        return Outcome(
            benchmark,
            shown,
            "failed",
            seconds,
            process.returncode,
            error=str(exc),
            stderr_tail=_tail(stderr) or _tail(stdout),
        )
    return Outcome(benchmark, shown, "ok", seconds, 0, report, figures, stderr_tail=_tail(stderr, 600))


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _tail(text: str | None, limit: int = STDERR_TAIL) -> str:
    text = (text or "").strip()
    return text[-limit:]


# ------------------------------------------------------------------------------------------ writing


def machine() -> dict[str, object]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model,
        "memory_gib": memory_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_revision(root: Path = ROOT) -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}{' (with uncommitted changes)' if dirty else ''}" if rev else "unknown"


def fmt(value: float) -> str:
    """A number for a table: thousands separated, about three significant digits."""
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    if magnitude == 0:
        return "0"
    return f"{value:.3g}"


def ratio_text(figure: Figure, by_name: dict[str, Figure]) -> str:
    if not figure.baseline:
        return ""
    base = by_name[figure.baseline]
    if base.median == 0:
        return f"n/a ({base.name} is 0)" if figure.median else f"both 0 ({base.name})"
    return f"{figure.median / base.median:.2f}x {base.name}"


def figure_row(figure: Figure, by_name: dict[str, Figure], quick: bool) -> str:
    runs = len(figure.runs)
    flag = "" if quick or runs >= MIN_RUNS else f" (fewer than {MIN_RUNS})"
    spread = f"{fmt(min(figure.runs))}{DASH}{fmt(max(figure.runs))}"
    better = "lower is better" if figure.better == "lower" else "higher is better"
    return (
        f"| {figure.name} | **{fmt(figure.median)}** {figure.unit} ({spread}) | {runs}{flag} | "
        f"{ratio_text(figure, by_name)} | {better} |"
    )


def render_markdown(
    outcomes: Sequence[Outcome],
    *,
    not_run: Sequence[Benchmark],
    quick: bool,
    started_at: datetime,
    seconds: float,
    host: dict[str, object],
    load_before: list[float] | None,
    load_after: list[float] | None,
    revision: str,
) -> str:
    lines = ["# Benchmarks: latest run", ""]
    mode = "quick mode (`--quick`: fewer runs, smaller sizes; not for quoting)" if quick else "full"
    lines += [
        f"Written by `make bench` (`python bench/run_all.py`) on {started_at:%Y-%m-%d %H:%M} UTC, "
        f"git {revision}, {mode}; the whole run took {seconds / 60:.1f} min.",
        "",
        f"**Machine:** {host['cores']} cores ({host['cpu'] or 'unknown CPU'}), "
        f"{host['memory_gib']} GiB RAM, {host['platform']}, Python {host['python']}. "
        "**The machine is shared and was not idle:** other work (other builds and test runs) was "
        f"running during this run (load average over 1/5/15 min: {load_before} before, {load_after} after). "
        f"Every figure is therefore the median over its runs, shown with the min{DASH}max across those runs; "
        "ratios compare medians of figures measured in the same run of the same benchmark.",
        "",
        f"Reading a row: **median** unit (min{DASH}max over the runs) | number of runs | ratio of this "
        "median to the named baseline's median.",
        "",
        "| benchmark | status | took | reproduce |",
        "| --- | --- | --- | --- |",
    ]
    for o in outcomes:
        status = {"ok": "ok", "failed": "**FAILED**", "timeout": "**TIMED OUT**"}.get(o.status, o.status)
        lines.append(f"| {o.benchmark.name} | {status} | {o.seconds:.0f} s | `{shlex.join(o.command)}` |")
    for b in not_run:
        lines.append(
            f"| {b.name} | not run in this invocation (`--only`) | | `{shlex.join(b.command(quick))}` |"
        )
    for o in outcomes:
        lines += ["", f"## {o.benchmark.name}: {o.benchmark.title}", ""]
        lines.append(f"Reproduce: `{shlex.join(o.command)}` (from the repository root, in .venv)")
        lines.append("")
        if o.status != "ok":
            lines.append(f"**{o.status.upper()}**: {o.error}. Took {o.seconds:.0f} s.")
            if o.stderr_tail:
                lines += ["", "stderr (tail):", "", "```", o.stderr_tail, "```"]
            continue
        by_name = {f.name: f for f in o.figures}
        lines += [
            f"| figure | median (min{DASH}max) | runs | vs baseline (same run) | |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [figure_row(f, by_name, quick) for f in o.figures]
        notes = o.report.get("notes") if o.report else None
        if isinstance(notes, list) and notes:
            lines += ["", *[f"- {note}" for note in notes]]
        if o.report and o.report.get("command") and o.report["command"] not in shlex.join(o.command):
            lines += ["", f"The script describes its own run as `{o.report['command']}`."]
    lines.append("")
    return "\n".join(lines)


def outcome_json(o: Outcome) -> dict[str, object]:
    return {
        "name": o.benchmark.name,
        "script": o.benchmark.script,
        "title": o.benchmark.title,
        "command": shlex.join(o.command),
        "status": o.status,
        "seconds": round(o.seconds, 1),
        "returncode": o.returncode,
        "error": o.error or None,
        "stderr_tail": o.stderr_tail or None,
        "report": o.report,
        "figures": [f.as_dict() for f in o.figures],
    }


def write_results(out: Path, markdown: str, document: dict[str, object]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.md").write_text(markdown)
    (out / "latest.json").write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")


# ----------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated benchmark names (see --list)")
    parser.add_argument(
        "--quick", action="store_true", help="fewer runs and smaller sizes, for trying it out"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="where latest.md/json go")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    everything = discover(ROOT / "bench", BENCHMARKS)
    if args.list:
        for b in everything:
            print(f"{b.name:10s} {shlex.join(b.command(args.quick))}")
        return 0
    chosen = select(everything, args.only)
    started_at = SystemClock().now()
    load_before = load_average()
    wall = time.perf_counter()
    outcomes: list[Outcome] = []
    for benchmark in chosen:
        print(f"[bench] {benchmark.name}: {shlex.join(benchmark.command(args.quick))}", flush=True)
        outcome = run_one(benchmark, quick=args.quick)
        outcomes.append(outcome)
        summary = outcome.error or ", ".join(
            f"{f.name} {fmt(f.median)} {f.unit}" for f in outcome.figures[:3]
        )
        print(f"[bench] {benchmark.name}: {outcome.status} in {outcome.seconds:.0f} s: {summary}", flush=True)
    seconds = time.perf_counter() - wall
    host, load_after, revision = machine(), load_average(), git_revision()
    not_run = [b for b in everything if b not in chosen]
    markdown = render_markdown(
        outcomes,
        not_run=not_run,
        quick=args.quick,
        started_at=started_at,
        seconds=seconds,
        host=host,
        load_before=load_before,
        load_after=load_after,
        revision=revision,
    )
    document = {
        "generated_at": started_at.isoformat(),
        "quick": args.quick,
        "seconds": round(seconds, 1),
        "git": revision,
        "machine": host,
        "load_average": {"before": load_before, "after": load_after},
        "shared_machine": True,
        "benchmarks": [outcome_json(o) for o in outcomes],
        "not_run": [b.name for b in not_run],
    }
    out = Path(args.out)
    write_results(out, markdown, document)
    failed = [o.benchmark.name for o in outcomes if o.status != "ok"]
    print(f"[bench] wrote {out / 'latest.md'}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
