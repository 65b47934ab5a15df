"""kill -9 of the service at random points: nothing acknowledged is lost, nothing is done twice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bench.crashtrial import run_trial
from refserver.testing import RefServer

# Two kill points per protocol with key lookup (each trial starts the service twice, about 7 CPU-s;
# the suite's time allows six).
# The 100-trial figure is bench/restart.py's.
TRIALS = 6


@pytest.mark.parametrize("trial", range(TRIALS))
def test_kill_minus_nine_loses_nothing_and_doubles_nothing(
    trial: int, tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> None:
    """After a crash and restart: 0 lost, 0 second operations, 0 double receipts, 0 double executions."""
    # Alternate the side-effecting tool's server between protocols with key lookup.
    name, tool = [("aip", "analyze_upload"), ("mcp", "generate_report"), ("ext", "apply_batch_change")][
        trial % 3
    ]
    result = run_trial(
        config=write_config(),
        ledger=tmp_path / "crash.duckdb",
        server_stats=servers[name].stats,
        tool=tool,
        calls=8,
        seed=1000 + trial,
        kill_window=0.8,
    )
    assert result.clean, result
    assert result.unfinished == 0, result
