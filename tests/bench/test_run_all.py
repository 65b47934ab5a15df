"""The `make bench` harness: reads figures.py reports, reports failures and timeouts, writes latest.md."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
from bench_kit import ROOT, load

from engine.clock import monotonic_seconds
from engine.testing.wait import wait_until

run_all = load("run_all")
figures = load("figures")


def _script(folder: Path, name: str, body: str) -> str:
    (folder / "bench").mkdir(exist_ok=True)
    (folder / "bench" / name).write_text(textwrap.dedent(body))
    return f"bench/{name}"


def _report_line(**overrides: object) -> str:
    report = figures.Report("demo", "python bench/x.py --runs 3")
    base = report.add("per-transition commit", "transitions/s", [100, 120, 110])
    report.add("group commit", "transitions/s", [4000, 5000, 4400], baseline=base.name)
    document = report.as_dict()
    document.update(overrides)
    return json.dumps(document)


def test_a_report_is_read_from_the_last_stdout_line_and_its_medians_are_recomputed():
    """Only the last non-empty line counts, and median/min/max come from the runs, not the text."""
    line = json.loads(_report_line())
    line["figures"][0]["median"] = 999  # a typed-in median is ignored
    stdout = "progress 1/3\nprogress 2/3\n" + json.dumps(line) + "\n\n"
    report, figs = run_all.parse_report(stdout)
    assert report["benchmark"] == "demo"
    assert [f.name for f in figs] == ["per-transition commit", "group commit"]
    assert figs[0].median == 110
    assert figs[1].baseline == "per-transition commit"


@pytest.mark.parametrize(
    ("stdout", "complaint"),
    [
        ("", "printed nothing"),
        ("all good\n", "not JSON"),
        ('{"benchmark": "x", "runs": 5}\n', "not a bench/figures.py report"),
        (_report_line(figures=[{"name": "a", "unit": "s", "runs": []}]), "malformed"),
        (
            _report_line(figures=[{"name": "a", "unit": "s", "runs": [1], "baseline": "nowhere"}]),
            "name no figure",
        ),
    ],
)
def test_output_that_is_not_a_figures_report_is_refused_with_the_reason(stdout, complaint):
    """No report, not JSON, a foreign shape, a figure without runs, a dangling baseline: each is named."""
    with pytest.raises(ValueError, match=complaint):
        run_all.parse_report(stdout)


def test_a_good_benchmark_is_ok_and_a_failing_one_is_reported_with_its_stderr(tmp_path):
    """Exit 0 with a report: ok. Non-zero exit: failed, with the tail of stderr kept."""
    good = run_all.Benchmark(
        "good",
        _script(tmp_path, "good.py", f"print('warming up')\nprint({_report_line()!r})\n"),
        "Good",
    )
    bad = run_all.Benchmark(
        "bad",
        _script(
            tmp_path,
            "bad.py",
            "import sys\nprint('boom: server did not start', file=sys.stderr)\nsys.exit(3)\n",
        ),
        "Bad",
    )
    ok = run_all.run_one(good, quick=False, root=tmp_path)
    failed = run_all.run_one(bad, quick=False, root=tmp_path)
    assert ok.status == "ok"
    assert [f.median for f in ok.figures] == [110, 4400]
    assert failed.status == "failed"
    assert failed.returncode == 3
    assert "boom: server did not start" in failed.stderr_tail
    assert "--json" in failed.command


def test_a_benchmark_past_its_timeout_is_killed_with_its_children_and_reported(tmp_path):
    """A timeout kills the whole process group (reference servers included) and says so."""
    pid_file = tmp_path / "child.pid"
    script = _script(
        tmp_path,
        "slow.py",
        f"""
        import subprocess, sys, threading
        child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("started", file=sys.stderr, flush=True)
        threading.Event().wait(60)
        """,
    )
    slow = run_all.Benchmark("slow", script, "Slow", timeout_s=2.0)
    started = monotonic_seconds()
    outcome = run_all.run_one(slow, quick=False, root=tmp_path)
    assert monotonic_seconds() - started < 30
    assert outcome.status == "timeout"
    assert "2 s" in outcome.error
    child = int(pid_file.read_text())
    wait_until(
        lambda: not _alive(child), timeout=10, what="the timed-out benchmark's child process to be gone"
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_latest_md_shows_the_command_median_range_runs_and_ratio_and_every_failure(tmp_path):
    """Each benchmark's reproduce command, median (min-max), run count and ratio; failures stay listed."""
    report, figs = run_all.parse_report(_report_line())
    benchmark = run_all.Benchmark("ledger", "bench/x.py", "Ledger", ("--runs", "3"))
    ok = run_all.Outcome(benchmark, benchmark.command(False), "ok", 12.0, 0, report, figs)
    broken = run_all.Benchmark("scale", "bench/scale.py", "Scale", ("--runs", "5"))
    failed = run_all.Outcome(
        broken,
        broken.command(False),
        "failed",
        1.0,
        2,
        error="exited with status 2",
        stderr_tail="usage: scale.py",
    )
    skipped = run_all.Benchmark("console", "bench/console.py", "Console", ("--runs", "5"))
    text = run_all.render_markdown(
        [ok, failed],
        not_run=[skipped],
        quick=False,
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        seconds=75,
        host={"cores": 2, "cpu": "test cpu", "memory_gib": 4, "platform": "linux", "python": "3.11"},
        load_before=[1.0, 1.0, 1.0],
        load_after=[2.0, 1.5, 1.0],
        revision="abc123",
    )
    assert "`python bench/x.py --runs 3 --json`" in text
    assert "**4,400** transitions/s (4,000\N{EN DASH}5,000) | 3 (fewer than 5)" in text
    assert "40.00x per-transition commit" in text
    assert "**FAILED**: exited with status 2" in text
    assert "usage: scale.py" in text
    assert "| console | not run in this invocation" in text
    assert "2 cores" in text
    assert "shared" in text


def test_only_selects_named_benchmarks_and_refuses_unknown_names():
    """--only picks by name and names the known ones when asked for something else."""
    chosen = run_all.select(run_all.BENCHMARKS, "ledger,pollers")
    assert [b.name for b in chosen] == ["ledger", "pollers"]
    with pytest.raises(SystemExit, match="known:"):
        run_all.select(run_all.BENCHMARKS, "ledger,nonsense")


def test_every_script_in_bench_is_run_even_if_it_is_not_listed(tmp_path):
    """A new bench/*.py script cannot be forgotten: discovery adds it (figures.py and run_all.py excepted)."""
    for name in ("figures.py", "run_all.py", "ledger_commit.py", "brand_new.py"):
        (tmp_path / name).write_text("")
    found = run_all.discover(tmp_path, [run_all.Benchmark("ledger", "bench/ledger_commit.py", "Ledger")])
    assert [b.name for b in found] == ["ledger", "brand_new"]
    assert found[1].command(False) == ["python", "bench/brand_new.py", "--json"]


def test_the_registry_names_every_benchmark_script_in_the_repository():
    """Every script in bench/ has an entry with its options (none falls back to the bare default)."""
    listed = {Path(b.script).name for b in run_all.BENCHMARKS}
    scripts = {p.name for p in (ROOT / "bench").glob("*.py")} - run_all.NOT_BENCHMARKS
    assert scripts <= listed
