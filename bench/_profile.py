"""Where the time goes: py-spy profiles of the two workloads issue 18 names, written under bench/results/profiles/.

* ``scale``: ``bench/scale.py --runs 1 --ops 10000`` (the executor in the benchmark's own process,
  10,000 operations in flight), sampled from start to end.
* ``ledger``: ``bench/ledger_commit.py --runs 3 --single 1`` (group commit of 20,000 transitions in
  batches of 5000 on a file ledger, three times; the per-transition baseline cut to one write).
* ``fastmcp``: the ``finality serve`` process of bench/fastmcp_compare.py's workload (200 concurrent
  3 s calls on a fresh fastmcp-tasks server, submitted through the API, durable ledger on disk),
  sampled from before the first submission until nothing is in flight.

For each it writes the collapsed stacks (``<name>-<label>.collapsed.txt.gz``, gzipped, the input
of any flame graph tool) and a summary (``<name>-<label>.md``: the functions with the most samples, by own time
and by time including callees). py-spy samples from outside the process, so the profiled code runs
unchanged (no tracing overhead on the figures). One installed beside the running interpreter is used;
else it lives in the benchmark's own virtualenv (bench/.venv-fastmcp, installed there on first use),
because nothing in the project needs it.

    python bench/_profile.py --label before [--only scale,fastmcp,ledger] [--ops 10000] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import fastmcp_compare as cmp
from engine.clock import SystemClock
from service.testing import ServiceProcess

CLOCK = SystemClock()

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "profiles"
PY_SPY_SPEC = "py-spy>=0.4,<0.5"


def py_spy() -> Path:
    # One installed beside the running interpreter (the project's own virtualenv) is used as it is.
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return beside
    python = cmp.venv_python()
    binary = python.parent / "py-spy"
    if not binary.exists():
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", PY_SPY_SPEC], check=True, timeout=600)
    return binary


def start_recording(
    binary: Path, out: Path, *, pid: int | None = None, command: list[str] | None = None
) -> subprocess.Popen[bytes]:
    args = [str(binary), "record", "--format", "raw", "--rate", "200", "--nonblocking", "-o", str(out)]
    if pid is not None:
        args += ["--pid", str(pid)]
    else:
        assert command is not None
        args += ["--", *command]
    # The profiled program's output goes to a file: a pipe nobody reads would fill and block it.
    log = (OUT / f"{out.name}.log").open("wb")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


def stop_recording(recorder: subprocess.Popen[bytes]) -> None:
    if recorder.poll() is None:
        recorder.send_signal(signal.SIGINT)
    try:
        recorder.wait(timeout=120)
    except subprocess.TimeoutExpired:
        recorder.kill()
        recorder.wait(timeout=30)


def compress(collapsed: Path) -> None:
    """``x.collapsed.txt`` -> ``x.collapsed.txt.gz`` (the raw stacks of a 10,000-operation run are ~13 MB)."""
    with collapsed.open("rb") as raw, gzip.open(collapsed.with_name(collapsed.name + ".gz"), "wb") as packed:
        shutil.copyfileobj(raw, packed)
    collapsed.unlink()


def summarise(collapsed: Path, title: str, top: int = 40, keep: Callable[[str], bool] | None = None) -> str:
    """The functions with the most samples, own and including callees, from py-spy's collapsed stacks
    (only the stacks ``keep`` accepts, if given)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or (keep is not None and not keep(stack)):
            continue
        count = int(count_text)
        total += count
        frames = [shorten(f) for f in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"# {title}", "", f"{total} samples at 200 Hz (about {total / 200:.0f} s of busy threads).", ""]
    for heading, counter in (("Own time (the frame itself)", own), ("Including callees", inclusive)):
        lines += [f"## {heading}", "", "| share | samples | frame |", "| ---: | ---: | --- |"]
        for frame, count in counter.most_common(top):
            lines.append(f"| {100 * count / max(total, 1):.1f} % | {count} | `{frame}` |")
        lines.append("")
    return "\n".join(lines)


def shorten(frame: str) -> str:
    """``fn (path/to/site-packages/pkg/mod.py:12)`` -> ``fn (pkg/mod.py)``: line numbers merged, paths cut."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        if str(ROOT) in path:
            path = path.split(str(ROOT) + "/", 1)[1]
    return f"{name} ({path})" if path else name


def profile_scale(binary: Path, label: str, ops: int) -> None:
    collapsed = OUT / f"scale-{label}.collapsed.txt"
    recorder = start_recording(
        binary,
        collapsed,
        command=[sys.executable, str(ROOT / "bench" / "scale.py"), "--runs", "1", "--ops", str(ops)],
    )
    recorder.wait(timeout=3600)
    (OUT / f"scale-{label}.md").write_text(
        summarise(collapsed, f"bench/scale.py --runs 1 --ops {ops} ({label}): the executor process") + "\n"
    )
    compress(collapsed)


def profile_ledger(binary: Path, label: str, ops: int) -> None:
    collapsed = OUT / f"ledger-{label}.collapsed.txt"
    command = [sys.executable, str(ROOT / "bench" / "ledger_commit.py"), "--runs", "3", "--single", "1"]
    recorder = start_recording(binary, collapsed, command=[*command, "--ops", str(ops)])
    recorder.wait(timeout=3600)
    (OUT / f"ledger-{label}.md").write_text(
        summarise(
            collapsed,
            f"bench/ledger_commit.py --runs 3 --single 1 --ops {ops} ({label}): the timed group commits",
            keep=timed_group_commit,
        )
        + "\n"
    )
    compress(collapsed)


def timed_group_commit(stack: str) -> bool:
    """A stack of ledger_commit.py's timed group commits (not the set-up: creating the operations,
    stepping their transitions, opening the ledger)."""
    return "group (ledger_commit.py" in stack and "apply_many" in stack and "prepare (" not in stack


def profile_fastmcp(binary: Path, label: str, calls: int) -> None:
    python = cmp.venv_python()
    workload = cmp.Workload(cmp.SERVERS[0], calls, 3.0, 1.0, 0)
    collapsed = OUT / f"fastmcp-{label}.collapsed.txt"
    server = cmp.Fresh(workload, python)
    folder = Path(tempfile.mkdtemp())
    try:
        service = ServiceProcess(
            folder / "ledger.duckdb", cmp.finality_config(folder, workload, server.endpoint)
        )
        service.start()
        try:
            assert service.pid is not None
            recorder = start_recording(binary, collapsed, pid=service.pid)
            CLOCK.sleep_blocking(timedelta(seconds=1.0))  # py-spy attaches before the first submission
            asyncio.run(cmp.submit_all(service.url, workload, workload.keys("fin")))
            cmp.wait_idle(service.url, 300)
            stop_recording(recorder)
        finally:
            service.stop()
    finally:
        server.close()
    (OUT / f"fastmcp-{label}.md").write_text(
        summarise(
            collapsed,
            f"finality serve under bench/fastmcp_compare.py's workload, {calls} calls of 3 s on fastmcp-tasks ({label})",
        )
        + "\n"
    )
    compress(collapsed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="before / after: part of the file names")
    parser.add_argument("--only", default="scale,fastmcp")
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    binary = py_spy()
    wanted = set(args.only.split(","))
    if "fastmcp" in wanted:
        profile_fastmcp(binary, args.label, args.calls)
    if "scale" in wanted:
        profile_scale(binary, args.label, args.ops)
    if "ledger" in wanted:
        profile_ledger(binary, args.label, 20_000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
