"""The snapshots analyst SQL reads on a DuckDB ledger cost the executor nothing it can avoid.

A snapshot is a copy of the whole ledger: its CPU grows with the ledger. These tests hold the two
rules that keep that cost on the readers' side: the service's ledger runs each statement on its
caller's thread (so a snapshot made on a niced reader thread stays niced), and a private snapshot
is kept ``SNAPSHOT_DUTY`` times as long as it took to make. Real DuckDB files throughout; time is
injected where the rule is about time.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from engine.ledger import duckdb_client
from engine.ledger.duckdb import Ledger
from engine.testing import FakeClock
from service.analysis import SNAPSHOT_DUTY, DuckDbReads
from service.config import AnalystConfig
from service.serve import open_service_ledger


def _thread_cpu() -> dict[int, float]:
    """CPU-seconds run so far by each thread of this process (Linux: its schedstat)."""
    out: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
        except OSError:
            continue  # a thread that ended meanwhile
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU from /proc")
def test_a_snapshot_of_the_services_ledger_spends_its_cpu_on_the_thread_that_asked_for_it(
    tmp_path: Path,
) -> None:
    """A snapshot made on a reader thread runs there alone: no DuckDB worker at the executor's priority helps."""
    path = tmp_path / "ledger.duckdb"
    Ledger.open(path).close()
    with duckdb_client.connect(str(path)) as con:
        # Several of DuckDB's row groups (122,880 rows each): enough for a parallel copy.
        con.execute("CREATE TABLE filler AS SELECT range AS a, range::VARCHAR AS b FROM range(400000)")
    ledger = open_service_ledger(str(path))
    assert isinstance(ledger, Ledger)
    try:
        ledger.snapshot(tmp_path / "warm.duckdb")  # first-use costs (extension loading) out of the way
        maker: list[int] = []
        made, sampled = threading.Event(), threading.Event()

        def make() -> None:
            maker.append(threading.get_native_id())
            ledger.snapshot(tmp_path / "snapshot.duckdb")
            made.set()
            sampled.wait(timeout=60)  # alive until its CPU is read

        before = _thread_cpu()
        thread = threading.Thread(target=make)
        thread.start()
        assert made.wait(timeout=120), "the snapshot did not finish"
        after = _thread_cpu()
        sampled.set()
        thread.join(timeout=60)
    finally:
        ledger.close()
    spent = {tid: run - before.get(tid, 0.0) for tid, run in after.items()}
    own = spent.pop(maker[0])
    spent.pop(threading.get_native_id(), None)  # this thread only waited
    others = sum(spent.values())
    assert own > 0.05, f"the snapshot took {own:.3f} CPU-s: too small a ledger to tell"
    assert others < 0.1 * own, (
        f"other threads ran {others:.3f} CPU-s during the snapshot (its own: {own:.3f})"
    )


class _TimedSource:
    """A real ledger whose snapshots take ``making_s`` on the injected monotonic clock, of which
    ``cpu_s`` (all of it unless said) on the injected CPU clock."""

    def __init__(
        self, ledger: Ledger, now: list[float], making_s: float, cpu: list[float], cpu_s: float | None = None
    ) -> None:
        self.ledger, self.now, self.making_s = ledger, now, making_s
        self.cpu, self.cpu_s = cpu, making_s if cpu_s is None else cpu_s
        self.made = 0

    @property
    def path(self) -> str:
        return self.ledger.path

    def snapshot(self, dest: str | Path) -> Path:
        self.made += 1
        self.now[0] += self.making_s
        self.cpu[0] += self.cpu_s
        return self.ledger.snapshot(dest)


def _reads(
    tmp_path: Path, making_s: float, cpu_s: float | None = None
) -> tuple[DuckDbReads, _TimedSource, list[float]]:
    now, cpu = [1000.0], [50.0]
    source = _TimedSource(Ledger.open(tmp_path / "ledger.duckdb"), now, making_s, cpu, cpu_s)
    reads = DuckDbReads(
        source, tmp_path, FakeClock(), AnalystConfig(), monotonic=lambda: now[0], cpu=lambda: cpu[0]
    )
    return reads, source, now


def test_a_snapshot_that_waited_for_cpu_is_kept_by_what_it_cost_not_by_how_long_it_waited(
    tmp_path: Path,
) -> None:
    """20 s of wall time on a starved reader thread but 0.1 CPU-s: remade after max_age (5 s), not after 200 s."""
    reads, source, now = _reads(tmp_path, making_s=20.0, cpu_s=0.1)
    try:
        reads.query("SELECT count(*) FROM operations", 10)
        now[0] += 6.0
        answer = reads.query("SELECT count(*) FROM operations", 10)
        assert source.made == 2
        assert answer["snapshot_age_s"] == 0.0
    finally:
        source.ledger.close()


def test_a_snapshot_that_takes_two_seconds_to_make_is_kept_ten_times_as_long_before_the_next(
    tmp_path: Path,
) -> None:
    """Past max_age (5 s) but within 10x its making time (20 s) the snapshot stands; after that it is remade."""
    reads, source, now = _reads(tmp_path, making_s=2.0)
    try:
        assert SNAPSHOT_DUTY == 10
        reads.query("SELECT count(*) FROM operations", 10)
        assert source.made == 1
        now[0] += 6.0  # older than max_age, younger than 10 x 2 s
        answer = reads.query("SELECT count(*) FROM operations", 10)
        assert source.made == 1
        assert answer["snapshot_age_s"] == 6.0
        now[0] += 14.5  # 20.5 s old: past 10 x its making time
        answer = reads.query("SELECT count(*) FROM operations", 10)
        assert source.made == 2
        assert answer["snapshot_age_s"] == 0.0
    finally:
        source.ledger.close()


def test_a_snapshot_made_quickly_is_still_remade_after_max_age(tmp_path: Path) -> None:
    """A snapshot that took 0.1 s follows max_age alone: remade once older than 5 s, not before."""
    reads, source, now = _reads(tmp_path, making_s=0.1)
    try:
        reads.query("SELECT 1", 1)
        now[0] += 4.9
        reads.query("SELECT 1", 1)
        assert source.made == 1
        now[0] += 0.2
        reads.query("SELECT 1", 1)
        assert source.made == 2
    finally:
        source.ledger.close()
