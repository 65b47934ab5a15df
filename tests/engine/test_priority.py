"""engine.priority on real processes: the one rule both analyst paths lower their process by."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from engine.priority import LOWEST_NICE, lower

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduling")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_process_lowered_to_the_lowest_niceness_also_runs_in_the_idle_class(
    sleeper: subprocess.Popen[bytes],
) -> None:
    assert lower(sleeper.pid, LOWEST_NICE) == LOWEST_NICE
    assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == LOWEST_NICE
    assert os.sched_getscheduler(sleeper.pid) == os.SCHED_IDLE


def test_a_process_lowered_above_the_lowest_niceness_stays_in_the_normal_class(
    sleeper: subprocess.Popen[bytes],
) -> None:
    assert lower(sleeper.pid, 10) == 10
    assert os.sched_getscheduler(sleeper.pid) == os.SCHED_OTHER


def test_lowering_never_raises_a_priority(sleeper: subprocess.Popen[bytes]) -> None:
    os.setpriority(os.PRIO_PROCESS, sleeper.pid, 15)
    assert lower(sleeper.pid, 10) == 15
    assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == 15


def test_a_process_that_is_gone_is_reported_not_raised() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert lower(child.pid, LOWEST_NICE) is None
